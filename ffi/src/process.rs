//! Tying a child process's life to its parent's: Linux's parent-death signal.
//!
//! `nuvec launch` starts ranks that must not outlive it, even when it is killed with SIGKILL
//! and cannot clean up. On Linux the kernel can deliver a signal to a process when its parent
//! dies (`PR_SET_PDEATHSIG`); that has to be requested by the child itself, between `fork`
//! and `exec`, which only `CommandExt::pre_exec` (an unsafe function) reaches. Elsewhere
//! [`kill_when_parent_dies`] does nothing and returns `false`: the launcher's guardian process
//! is the mechanism that works on every system; this is an extra, immediate one.

use std::process::Command;

/// Arranges for the process `command` starts to receive SIGKILL when the thread that spawns
/// it exits (on Linux the "parent" of `PR_SET_PDEATHSIG` is the spawning thread, so spawn
/// from a thread that lives as long as the child should, e.g. the main thread). A child
/// whose parent is already gone by the time it runs fails to start instead of running
/// orphaned. Returns whether the request could be made on this system (Linux only).
pub fn kill_when_parent_dies(command: &mut Command) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id();
        let hook = move || {
            // Only async-signal-safe calls between fork and exec: two system calls, and an
            // error built from an errno (no allocation).
            if prctl_pdeathsig(libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the request: then nobody will signal us.
            if std::os::unix::process::parent_id() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        };
        // SAFETY: `pre_exec`'s contract is that the closure, run in the forked child before
        // `exec`, only does what is async-signal-safe there. It makes the `prctl` and
        // `getppid` system calls and builds an `io::Error` from an errno, which does not
        // allocate or take a lock; it captures only a `u32` by value.
        unsafe {
            command.pre_exec(hook);
        }
        true
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = command;
        false
    }
}

/// `prctl(PR_SET_PDEATHSIG, signal)`; returns its result (0, or -1 with errno set).
#[cfg(target_os = "linux")]
fn prctl_pdeathsig(signal: libc::c_int) -> libc::c_int {
    // SAFETY: PR_SET_PDEATHSIG takes the signal number as its one argument (an integer,
    // no pointer); the trailing arguments are unused and passed as 0 as prctl(2) asks.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    fn alive(pid: u32) -> bool {
        // A zombie (dead, not yet reaped by its new parent) counts as dead.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => !stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z')),
            Err(_) => false,
        }
    }

    #[test]
    fn the_child_is_killed_when_the_spawning_thread_exits() {
        // The spawning thread is the "parent" PR_SET_PDEATHSIG watches: a thread that spawns
        // `sleep` and exits stands in for a launcher that dies.
        let (pid, mut child) = std::thread::spawn(|| {
            let mut command = Command::new("sh");
            command
                .args(["-c", "echo $$; exec sleep 30"])
                .stdout(Stdio::piped());
            assert!(kill_when_parent_dies(&mut command));
            let mut child = command.spawn().expect("sh starts");
            let mut line = String::new();
            BufReader::new(child.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            (line.trim().parse::<u32>().unwrap(), child)
        })
        .join()
        .unwrap();
        assert_eq!(pid, child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    }
}
