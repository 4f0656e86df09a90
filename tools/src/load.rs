//! Whether other work is using the machine when `nuvec bench` starts: the CPU time other
//! processes take during a short window while the bench sleeps, the busiest of them, and
//! the load average.
//!
//! Ranks on one machine share its CPUs, so the figures of a loaded machine measure the
//! scheduler, not the collective: a 1 MiB all_sum at P = 3 measured 12 ms while a build
//! ran and 223 µs idle on a 2-CPU VM. A run cannot remove the load, but it can say so in its
//! header, so that a figure is not taken for what the library does.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System};

/// Other processes keeping more than this many CPUs busy (a quarter of one CPU, on
/// average over the window) make the bench warn: an idle machine shows a few hundredths
/// (kernel threads, daemons), and one busy process anywhere near the ranks' CPUs shows
/// up in their latencies.
pub const BUSY_LIMIT: f64 = 0.25;

/// How long [`sample`] watches: long enough for sysinfo's CPU accounting (which needs
/// 200 ms between two reads) and to smooth a short burst, short enough to add little to a
/// run.
pub const WINDOW: Duration = Duration::from_millis(500);

/// One process that used CPU time during the window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Busy {
    /// Its name.
    pub name: String,
    /// Its PID.
    pub pid: u32,
    /// Its CPU time over the window, as a share of one CPU (1.0: one CPU all the time).
    pub cpus: f64,
}

/// What [`sample`] saw.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Load {
    /// The CPUs of the machine.
    pub cpus: usize,
    /// How many CPUs' worth of time processes other than this one used during the window
    /// (0 to `cpus`).
    pub others: f64,
    /// The one-minute load average (0 where the system has none).
    pub load_average: f64,
    /// The processes that used at least 5% of a CPU, busiest first.
    pub busiest: Vec<Busy>,
    /// How long it watched.
    pub window: Duration,
}

impl Load {
    /// The header's line: "0.02 of 2 CPUs busy with other work (over 0.5 s); load
    /// average 0.31".
    pub fn text(&self) -> String {
        format!(
            "{:.2} of {} CPUs busy with other work (over {:.1} s); load average {:.2}",
            self.others,
            self.cpus,
            self.window.as_secs_f64(),
            self.load_average
        )
    }

    /// The warning to print above the tables when other work kept more than
    /// [`BUSY_LIMIT`] CPUs busy, naming the three busiest processes.
    pub fn warning(&self) -> Option<String> {
        if self.others <= BUSY_LIMIT {
            return None;
        }
        let names: Vec<String> = self
            .busiest
            .iter()
            .take(3)
            .map(|b| format!("{} (pid {}, {:.0}%)", b.name, b.pid, b.cpus * 100.0))
            .collect();
        let who = if names.is_empty() {
            String::new()
        } else {
            format!(": {}", names.join(", "))
        };
        Some(format!(
            "the machine is loaded: other processes kept {:.2} of its {} CPUs busy{who}; \
             ranks share the CPUs with them, so these figures are the scheduler's as much as \
             the library's (rerun on an idle machine to compare)",
            self.others, self.cpus
        ))
    }
}

/// Watches the machine for `window` while this thread sleeps, and says what else used it.
pub fn sample(window: Duration) -> Load {
    let kind = ProcessRefreshKind::nothing().with_cpu().without_tasks();
    let mut system = System::new();
    system.refresh_cpu_usage();
    system.refresh_processes_specifics(ProcessesToUpdate::All, true, kind);
    std::thread::sleep(window.max(sysinfo::MINIMUM_CPU_UPDATE_INTERVAL));
    system.refresh_cpu_usage();
    system.refresh_processes_specifics(ProcessesToUpdate::All, true, kind);
    let cpus = system.cpus().len().max(1);
    let own = sysinfo::get_current_pid().ok();
    let mine = own
        .and_then(|pid| system.process(pid))
        .map_or(0.0, |p| f64::from(p.cpu_usage()) / 100.0);
    // The global figure is the average over every CPU, in percent; this process's own time
    // (the sampling itself) is taken out.
    let all = f64::from(system.global_cpu_usage()) / 100.0 * cpus as f64;
    let others = (all - mine).clamp(0.0, cpus as f64);
    let mut busiest: Vec<Busy> = system
        .processes()
        .values()
        .filter(|p| Some(p.pid()) != own)
        .map(|p| Busy {
            name: p.name().to_string_lossy().into_owned(),
            pid: p.pid().as_u32(),
            cpus: f64::from(p.cpu_usage()) / 100.0,
        })
        .filter(|b| b.cpus >= 0.05)
        .collect();
    busiest.sort_by(|a, b| b.cpus.total_cmp(&a.cpus));
    Load {
        cpus,
        others,
        load_average: System::load_average().one,
        busiest,
        window,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(others: f64, busiest: Vec<Busy>) -> Load {
        Load {
            cpus: 2,
            others,
            load_average: 1.5,
            busiest,
            window: WINDOW,
        }
    }

    #[test]
    fn an_idle_machine_gets_no_warning_and_a_loaded_one_names_its_busiest_processes() {
        let idle = load(0.03, Vec::new());
        assert_eq!(idle.warning(), None);
        assert_eq!(
            idle.text(),
            "0.03 of 2 CPUs busy with other work (over 0.5 s); load average 1.50"
        );
        assert_eq!(load(BUSY_LIMIT, Vec::new()).warning(), None);
        let busy = load(
            1.1,
            vec![Busy {
                name: "rustc".into(),
                pid: 42,
                cpus: 0.97,
            }],
        );
        let warning = busy.warning().unwrap();
        assert!(
            warning.starts_with(
                "the machine is loaded: other processes kept 1.10 of its 2 CPUs busy: rustc \
                 (pid 42, 97%);"
            ),
            "{warning}"
        );
    }

    /// A process that spins throughout the window is among the busy ones, and its time is
    /// in `others` (by how much depends on what else runs, so only that it is seen).
    #[test]
    fn a_spinning_process_is_seen() {
        let mut spinner = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        // sysinfo computes a process's share from its second reading on, and skips one
        // whose first reading is zero CPU time: let it use some first.
        std::thread::sleep(Duration::from_millis(200));
        let seen = sample(WINDOW);
        let _ = spinner.kill();
        let _ = spinner.wait();
        let spun = seen.busiest.iter().find(|b| b.pid == spinner.id());
        let spun =
            spun.unwrap_or_else(|| panic!("the spinner {} is not among {seen:?}", spinner.id()));
        assert!(seen.others >= spun.cpus * 0.9, "{seen:?}");
        assert!(seen.others <= seen.cpus as f64, "{seen:?}");
    }
}
