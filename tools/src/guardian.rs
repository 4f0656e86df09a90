//! The launcher's guardian: a small process that ends the ranks and removes the launch's
//! temporary folder when the launcher dies without doing it itself (SIGKILL, a crash, the
//! OOM killer).
//!
//! The ranks run in process groups of their own (so that a terminal's Ctrl-C reaches only the
//! launcher), so nothing the kernel does on the launcher's death reaches them by itself. The
//! guardian is started first, in a process group of its own, holding the read end of a pipe
//! whose write end only the launcher holds (close-on-exec keeps it out of the ranks). The
//! launcher writes `+PID` for each rank it starts and `-PID` for each it reaps; when the
//! launch ends normally it writes `done` and the guardian exits. When the launcher dies for
//! any reason, the kernel closes the write end: the guardian reads end-of-file, sends SIGKILL
//! to the process group of every rank still listed (only processes the launcher started, and
//! never one it has reaped, whose PID may be reused) and removes the temporary folder.
//!
//! It is a POSIX shell script rather than Rust, so that it works for every caller of the
//! runner (`nuvec launch`, `nuvec bench`, the benchmark harness) whatever the executable,
//! on Linux and macOS alike, and cannot outlive its purpose by more than a read.
//!
//! A remote rank's local process is its ssh client (`ssh -tt`): killing it closes the
//! connection, and sshd hangs up the rank's terminal, which sends the rank SIGHUP (a rank
//! that ignores SIGHUP survives; its PID file and hostfile stay in the remote's temporary
//! folder, as after any failed remote rank).

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

/// The guardian's script: `$1` is the folder to remove (may be empty: none). It ignores the
/// terminal's signals (it must outlive the launcher), says `ready` once it does, collects the
/// PIDs it is given and, at end-of-file without `done`, kills their process groups and
/// removes the folder.
pub const SCRIPT: &str = r#"trap '' INT TERM HUP QUIT
echo ready
pids=
while IFS= read -r line; do
  case $line in
    done) exit 0 ;;
    +*) pids="$pids ${line#+}" ;;
    -*) left=; for p in $pids; do [ "$p" = "${line#-}" ] || left="$left $p"; done; pids=$left ;;
  esac
done
for p in $pids; do kill -s KILL -- "-$p" 2>/dev/null; done
if [ -n "$1" ]; then rm -rf -- "$1"; fi
"#;

/// The launcher's end of a running guardian.
#[derive(Debug)]
pub struct Guardian {
    child: Child,
    input: Option<ChildStdin>,
}

impl Guardian {
    /// Starts a guardian that removes `folder` (if any) when the launcher dies.
    ///
    /// # Errors
    ///
    /// `sh` cannot be started, or exits before it is ready.
    pub fn start(folder: Option<&Path>) -> io::Result<Guardian> {
        let folder = folder.map(|f| f.as_os_str().to_owned()).unwrap_or_default();
        let mut child = Command::new("sh")
            .args(["-c", SCRIPT, "nuvec-guardian"])
            .arg(folder)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Away from the launcher's group, so that a terminal's signals do not end it.
            .process_group(0)
            .spawn()?;
        let input = child.stdin.take();
        // Until its traps are set, a signal would end it: wait for them (a few milliseconds
        // of shell start-up, once per launch), so no rank starts unguarded.
        let mut ready = String::new();
        if let Some(out) = child.stdout.take() {
            BufReader::new(out).read_line(&mut ready)?;
        }
        if ready.trim_end() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other(
                "the launcher's guardian (sh) did not start",
            ));
        }
        Ok(Guardian { child, input })
    }

    /// The guardian's PID.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Has the guardian kill `pid`'s process group if the launcher dies. `pid` must lead its
    /// own process group and be a child of the launcher not yet reaped.
    pub fn watch(&mut self, pid: u32) {
        self.send(&format!("+{pid}\n"));
    }

    /// Takes `pid` off the list: call it when the process has been reaped.
    pub fn forget(&mut self, pid: u32) {
        self.send(&format!("-{pid}\n"));
    }

    /// Ends the guardian without it doing anything, and waits for it.
    pub fn dismiss(mut self) {
        self.send("done\n");
        self.input = None;
        let _ = self.child.wait();
    }

    fn send(&mut self, line: &str) {
        // A guardian that is gone cannot be helped; the launch goes on without it.
        if let Some(input) = &mut self.input
            && input.write_all(line.as_bytes()).is_err()
        {
            self.input = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Whether our child has exited (they are the test's children, so they stay zombies
    /// until waited for, and `kill -0` would still find them).
    fn gone(child: &mut Child) -> bool {
        matches!(child.try_wait(), Ok(Some(_)))
    }

    fn alive_by_kill(pid: u32) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
    }

    fn sleeper() -> Child {
        Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    fn wait_until(mut what: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !what() {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    #[test]
    fn at_end_of_file_it_kills_the_watched_groups_and_removes_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hostfile"), "x").unwrap();
        let (mut a, mut b, mut reaped) = (sleeper(), sleeper(), sleeper());
        let mut guardian = Guardian::start(Some(dir.path())).unwrap();
        guardian.watch(a.id());
        guardian.watch(reaped.id());
        guardian.watch(b.id());
        // A process the launcher reaped is off the list: its PID may belong to someone else.
        reaped.kill().unwrap();
        reaped.wait().unwrap();
        guardian.forget(reaped.id());
        // What the kernel does when the launcher dies: the write end closes.
        guardian.input = None;
        assert!(wait_until(|| gone(&mut a) & gone(&mut b)));
        assert!(wait_until(|| !dir.path().exists()));
        assert!(guardian.child.wait().unwrap().success());
    }

    #[test]
    fn dismissed_it_leaves_everything_alone() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = sleeper();
        let mut guardian = Guardian::start(Some(dir.path())).unwrap();
        guardian.watch(a.id());
        let pid = guardian.id();
        guardian.dismiss();
        assert!(!alive_by_kill(pid), "dismiss waits for the guardian");
        assert!(!gone(&mut a) && dir.path().exists());
        a.kill().unwrap();
        a.wait().unwrap();
    }

    #[test]
    fn terminal_signals_do_not_end_it() {
        let mut a = sleeper();
        let mut guardian = Guardian::start(None).unwrap();
        guardian.watch(a.id());
        let group = nix::unistd::Pid::from_raw(guardian.id() as i32);
        for signal in [
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::Signal::SIGHUP,
            nix::sys::signal::Signal::SIGTERM,
        ] {
            nix::sys::signal::killpg(group, signal).unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(!gone(&mut a), "the guardian acted on a signal");
        guardian.input = None;
        assert!(wait_until(|| gone(&mut a)));
        assert!(guardian.child.wait().unwrap().success());
    }
}
