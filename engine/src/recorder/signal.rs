//! The flight record on a signal: once a group opts in ([`Options::flight_signal`],
//! [`FLIGHT_SIGNAL_VAR`](crate::FLIGHT_SIGNAL_VAR)), SIGUSR1 makes the process write the
//! record of every group alive that opted in, as [`FlightRecord::write`] does, and say
//! where on stderr: what an operator asks a hung job for without ending it.
//!
//! The handler is `signal-hook`'s: it only wakes a thread of this module (through a
//! self-pipe), which takes the records and writes them, so nothing runs in the signal
//! handler itself and no `unsafe` is needed here. The groups are found through a registry
//! of weak references to their recorders, written when a group forms, never by a
//! collective: a group that is dropped leaves a dead entry, pruned at the next
//! registration.
//!
//! [`Options::flight_signal`]: crate::Options::flight_signal
//! [`FlightRecord::write`]: super::FlightRecord::write

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use signal_hook::consts::SIGUSR1;
use signal_hook::iterator::Signals;

use super::Recorder;

/// The recorders of the groups that opted in, in the order they formed.
static LIVE: Mutex<Vec<Weak<Recorder>>> = Mutex::new(Vec::new());

/// Whether the thread that answers SIGUSR1 runs, or why it could not be started.
static LISTENER: OnceLock<Result<(), String>> = OnceLock::new();

/// Adds `recorder` to the records SIGUSR1 writes, installing the handler and its thread if
/// this is the first. A handler that cannot be installed is logged (`warn`), and the
/// group forms without it.
pub(super) fn register(recorder: &Arc<Recorder>) {
    if let Err(e) = LISTENER.get_or_init(listen) {
        log::warn!(
            "rank {}: {e}; SIGUSR1 will not write the group's flight record",
            recorder.rank
        );
        return;
    }
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|r| r.strong_count() > 0);
    live.push(Arc::downgrade(recorder));
}

/// Installs the handler and starts the thread that waits for SIGUSR1.
fn listen() -> Result<(), String> {
    let mut signals = Signals::new([SIGUSR1])
        .map_err(|e| format!("installing a SIGUSR1 handler for flight records: {e}"))?;
    std::thread::Builder::new()
        .name("nuvec-flight-signal".into())
        .spawn(move || {
            for _ in signals.forever() {
                let mut stderr = std::io::stderr().lock();
                for line in dump_live() {
                    // Not `eprintln!`, which panics when stderr is closed.
                    let _ = writeln!(stderr, "nuvec: SIGUSR1: {line}");
                }
            }
        })
        .map_err(|e| format!("starting the thread that answers SIGUSR1: {e}"))?;
    Ok(())
}

/// Writes the record of every live group that opted in; a line per group saying where its
/// record went, or why it could not be written.
pub(crate) fn dump_live() -> Vec<String> {
    let live: Vec<Arc<Recorder>> = LIVE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    if live.is_empty() {
        return vec!["no group that writes its flight record on SIGUSR1 is alive".into()];
    }
    live.iter()
        .map(|recorder| {
            let dir = recorder.dump_dir.clone().unwrap_or_else(fallback_dir);
            let record = recorder.snapshot();
            let group = format!(
                "rank {} of {} ({}, {} call{})",
                record.rank,
                record.size,
                record.backend,
                record.calls,
                if record.calls == 1 { "" } else { "s" }
            );
            match record.write(&dir) {
                Ok([json, _]) => format!("{group}: flight record in {}", json.display()),
                Err(e) => format!("{group}: the flight record could not be written: {e}"),
            }
        })
        .collect()
}

/// Where a group that names no flight directory writes on a signal: `nuvec-flight-<pid>`
/// under the system's temporary directory.
fn fallback_dir() -> PathBuf {
    std::env::temp_dir().join(format!("nuvec-flight-{}", std::process::id()))
}
