//! When a forming group says what it still waits for: every bootstrap (the TCP ring's, the
//! native wire's, JACCL's side channel) reports on this schedule, naming the peers it is
//! missing, so that a missing peer is named within seconds rather than only at the timeout.

use std::time::{Duration, Instant};

/// When a forming rank first says what it still waits for, and then how often: a launch
/// that forms normally is done well within the first (tens of milliseconds on one host), and
/// a missing peer is named within seconds instead of only at the timeout (30 s by default).
const FIRST_REPORT: Duration = Duration::from_secs(2);
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// The reports of a forming group: at [`FIRST_REPORT`], then at every multiple of
/// [`REPORT_EVERY`] (2 s, 5 s, 10 s, 15 s, ...), each naming the peers still missing.
pub(crate) struct Reports {
    started: Instant,
    next: Duration,
}

impl Reports {
    /// The schedule of a set-up that started at `started`.
    pub(crate) fn new(started: Instant) -> Self {
        Reports {
            started,
            next: FIRST_REPORT,
        }
    }

    /// When the next report is due (the setup loop wakes for it).
    pub(crate) fn due(&self) -> Instant {
        crate::options::deadline(self.started, self.next)
    }

    /// How long setup has run, if a report is due at `now`; schedules the next one.
    pub(crate) fn take(&mut self, now: Instant) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed < self.next {
            return None;
        }
        while self.next <= elapsed {
            self.next = next_report(self.next);
        }
        Some(elapsed)
    }
}

/// The report after one at `at`: the next multiple of [`REPORT_EVERY`].
fn next_report(at: Duration) -> Duration {
    let every = REPORT_EVERY.as_millis();
    Duration::from_millis(((at.as_millis() / every + 1) * every) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_forming_rank_reports_at_2_s_then_at_every_5_s() {
        let s = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut reports = Reports::new(t0);
        assert_eq!(reports.due(), t0 + 2 * s);
        assert_eq!(reports.take(t0 + 1999 * MS), None);
        assert_eq!(reports.take(t0 + 2 * s), Some(2 * s));
        assert_eq!(reports.due(), t0 + 5 * s);
        assert_eq!(reports.take(t0 + 4 * s), None);
        assert_eq!(reports.take(t0 + 5 * s), Some(5 * s));
        // A late wake makes one report, not one per missed slot.
        assert_eq!(reports.take(t0 + 17 * s), Some(17 * s));
        assert_eq!(reports.due(), t0 + 20 * s);
        assert_eq!(reports.take(t0 + 18 * s), None);
    }
}
