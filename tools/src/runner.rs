//! Starting and supervising the processes of a launch: local ranks as child processes,
//! remote ranks through ssh; their output copied line by line (prefixed with the rank),
//! standard input broadcast to them, SIGINT, SIGTERM and SIGHUP forwarded, and when one
//! rank fails, the others ended.
//!
//! Every child is the leader of its own process group. A terminal's Ctrl-C then reaches only
//! the launcher, which forwards it once to each rank's group (the rank and anything it
//! started), instead of every process receiving it twice. Signals go only to children that
//! have not been reaped yet: a PID stays reserved until its zombie is waited for, and the
//! launcher waits for its children only in the loop that also signals them, so it never
//! signals a PID that could have been reused.
//!
//! Ranks die with the launcher even when it is killed and cannot end them: see
//! [`crate::guardian`] (every system) and the parent-death signal (Linux).

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgrp, tcgetpgrp};

use crate::guardian::Guardian;
use crate::launch::{PIDFILE_MARKER, Plan, remote_kill_command, ssh_command};

/// One process to start.
#[derive(Debug)]
pub struct Job {
    /// Its rank (for the output prefix and messages).
    pub rank: usize,
    /// Where it runs: `127.0.0.1` or the ssh host.
    pub host: String,
    /// What to run; [`run_jobs`] sets its standard streams and process group.
    pub command: Command,
    /// Whether `command` is ssh to a remote host running [`Plan::remote_script`].
    pub remote: bool,
}

/// How to run the jobs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Prefix each output line with `[rank] `.
    pub prefix_output: bool,
    /// Copy the launcher's standard input to every job (else local jobs get none).
    pub forward_stdin: bool,
    /// Log what is started and how each job ends, on stderr.
    pub verbose: bool,
    /// After a rank fails, how long the others get to notice and exit on their own (their
    /// own report of the failure is worth reading) before they are sent SIGTERM.
    pub grace: Duration,
    /// After SIGTERM, how long before SIGKILL.
    pub kill_after: Duration,
    /// Who speaks in messages, e.g. `nuvec launch`.
    pub name: String,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            prefix_output: true,
            forward_stdin: true,
            verbose: false,
            grace: Duration::from_millis(500),
            kill_after: Duration::from_secs(3),
            name: "nuvec launch".into(),
        }
    }
}

/// How a launch ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every rank exited successfully.
    Success,
    /// This rank failed first; `ended` lists the ranks that were still running and were
    /// ended because of it.
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its host.
        host: String,
        /// How it exited.
        status: ExitStatus,
        /// The ranks the launcher ended.
        ended: Vec<usize>,
    },
    /// The launcher received this signal and forwarded it.
    Interrupted {
        /// The signal.
        signal: Signal,
    },
}

impl Outcome {
    /// The launcher's exit code: 0 on success; a failed rank's own code, or 128 + its
    /// signal; 128 + the signal received when interrupted.
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Success => 0,
            Outcome::RankFailed { status, .. } => match (status.code(), status.signal()) {
                (Some(code), _) if (1..=255).contains(&code) => code as u8,
                (_, Some(sig)) => (128 + sig).clamp(1, 255) as u8,
                _ => 1,
            },
            Outcome::Interrupted { signal } => (128 + *signal as i32).clamp(1, 255) as u8,
        }
    }

    /// What to tell the user, or `None` on success.
    pub fn message(&self) -> Option<String> {
        match self {
            Outcome::Success => None,
            Outcome::RankFailed {
                rank,
                host,
                status,
                ended,
            } => {
                let ended = match ended.as_slice() {
                    [] => String::new(),
                    [one] => format!("; ended rank {one}"),
                    many => format!(
                        "; ended ranks {}",
                        many.iter()
                            .map(usize::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                // ssh exits 255 when it fails itself (the program's own 255 looks the
                // same, hence "likely"); its message was relayed under the rank's prefix.
                let ssh = if host != crate::launch::LOCAL_HOST && status.code() == Some(255) {
                    format!(
                        " (ssh's own failure, likely: see its message above; `nuvec doctor \
                         --hosts {host}` checks the connection)"
                    )
                } else {
                    String::new()
                };
                Some(format!("rank {rank} ({host}) failed: {status}{ssh}{ended}"))
            }
            Outcome::Interrupted { signal } => Some(format!(
                "interrupted by {signal}, which was forwarded to every rank"
            )),
        }
    }
}

/// Why a launch could not start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Temporary files or the signal handlers could not be set up.
    #[error("preparing the launch: {0}")]
    Prepare(#[source] io::Error),
    /// `--cwd` is not a directory on this machine.
    #[error("--cwd {0}: not a directory on this machine")]
    Cwd(String),
    /// A rank's process could not be started (the ranks already started were ended).
    #[error("starting rank {rank} ({program}): {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

impl LaunchError {
    /// The exit code a shell would give: 127 for a program not found, 126 for one that
    /// cannot be run, else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            LaunchError::Spawn { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => 127,
                io::ErrorKind::PermissionDenied => 126,
                _ => 1,
            },
            _ => 1,
        }
    }
}

/// Starts every rank of `plan` and supervises them until all have exited. Local ranks get
/// the plan's files in a temporary directory that lives as long as the launch.
///
/// # Errors
///
/// A missing `--cwd`, temporary files that cannot be written, or a rank that cannot be
/// started.
pub fn run_plan(plan: &Plan, options: &RunOptions) -> Result<Outcome, LaunchError> {
    let log = |message: String| {
        if options.verbose {
            eprintln!("[{}] {message}", options.name);
        }
    };
    for skipped in &plan.skipped_env {
        eprintln!(
            "[{}] warning: {skipped:?} is not a valid environment variable, so it is ignored",
            options.name
        );
    }
    let launcher_cwd = std::env::current_dir().map_err(LaunchError::Prepare)?;
    let files = tempfile::Builder::new()
        .prefix("nuvec-launch-")
        .tempdir()
        .map_err(LaunchError::Prepare)?;
    log(format!(
        "backend {}, {} ranks on {}",
        plan.backend,
        plan.size(),
        plan.hosts.join(", ")
    ));
    for (var, content) in &plan.files {
        log(format!("{var}: {content}"));
    }
    log(format!("running {:?}", plan.command));
    let jobs = jobs(plan, &launcher_cwd, files.path())?;
    let outcome = run_jobs_removing(jobs, options, Some(files.path()));
    drop(files);
    outcome
}

/// The jobs of `plan`: local ranks run the command directly with the environment and
/// files (written into `files_dir`); remote ranks run ssh with [`Plan::remote_script`].
///
/// # Errors
///
/// A `--cwd` that is not a directory here (when a rank is local), or a file that cannot be
/// written.
pub fn jobs(plan: &Plan, launcher_cwd: &Path, files_dir: &Path) -> Result<Vec<Job>, LaunchError> {
    let any_local = (0..plan.size()).any(|r| plan.is_local(r));
    if let Some(cwd) = &plan.cwd
        && any_local
        && !Path::new(cwd).is_dir()
    {
        return Err(LaunchError::Cwd(cwd.clone()));
    }
    let mut paths: Vec<(&str, PathBuf)> = Vec::new();
    if any_local {
        for (i, (var, content)) in plan.files.iter().enumerate() {
            let path = files_dir.join(format!("{i}-{}", var.to_ascii_lowercase()));
            std::fs::write(&path, Plan::file_text(content)).map_err(LaunchError::Prepare)?;
            paths.push((var, path));
        }
    }
    let launcher_cwd = launcher_cwd.to_string_lossy();
    Ok((0..plan.size())
        .map(|rank| {
            let host = plan.hosts[rank].clone();
            if plan.is_local(rank) {
                let mut command = Command::new(&plan.command[0]);
                command.args(&plan.command[1..]);
                command.envs(plan.env.iter().map(|(k, v)| (k, v)));
                for (var, path) in &paths {
                    command.env(var, path);
                }
                command.env("MLX_RANK", rank.to_string());
                if let Some(cwd) = &plan.cwd {
                    command.current_dir(cwd);
                }
                Job {
                    rank,
                    host,
                    command,
                    remote: false,
                }
            } else {
                let argv = ssh_command(&host, &plan.remote_script(rank, &launcher_cwd));
                let mut command = Command::new(&argv[0]);
                command.args(&argv[1..]);
                Job {
                    rank,
                    host,
                    command,
                    remote: true,
                }
            }
        })
        .collect())
}

/// A started job.
struct Running {
    rank: usize,
    host: String,
    remote: bool,
    child: Child,
    /// Set once the child has been waited for; from then on its PID is never used.
    status: Option<ExitStatus>,
    /// A remote rank's PID file, from the first line it prints.
    pidfile: Arc<Mutex<Option<String>>>,
    /// Input for a remote rank's terminal (Ctrl-C is written there).
    terminal: Option<mpsc::Sender<Vec<u8>>>,
}

impl Running {
    /// Sends `signal` to the job. A local job's process group receives it. A remote rank
    /// gets SIGINT as a Ctrl-C on its terminal; for anything else its program is sent
    /// SIGTERM through its PID file, and then ssh is sent the signal (SIGKILL of ssh hangs
    /// up the remote terminal).
    fn signal(&mut self, signal: Signal, helpers: &mut Vec<Child>) {
        if self.status.is_some() {
            return;
        }
        let group = Pid::from_raw(self.child.id() as i32);
        if !self.remote {
            let _ = killpg(group, signal);
            return;
        }
        if signal == Signal::SIGINT
            && let Some(terminal) = &self.terminal
        {
            let _ = terminal.send(vec![0x03]);
            return;
        }
        if signal != Signal::SIGKILL
            && let Some(pidfile) = self.pidfile.lock().ok().and_then(|p| p.clone())
        {
            let argv = remote_kill_command(&self.host, &pidfile);
            if let Ok(child) = Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
            {
                helpers.push(child);
            }
        }
        let _ = killpg(group, signal);
    }
}

/// The launcher's view of the signals it handles: one flag per forwarded signal and a
/// wake-up socket that every handled signal (SIGCHLD too) writes a byte into, so the
/// supervisor sleeps until something happens. Installed once per process.
struct Watch {
    wake: Mutex<UnixStream>,
    flags: Vec<(Signal, Arc<AtomicBool>)>,
    /// Set when a forwarded signal arrived, for callers that run several launches.
    seen: AtomicBool,
}

const FORWARDED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

impl Watch {
    fn get() -> io::Result<&'static Watch> {
        static WATCH: OnceLock<Watch> = OnceLock::new();
        static INSTALL: Mutex<()> = Mutex::new(());
        let _guard = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(watch) = WATCH.get() {
            return Ok(watch);
        }
        let (read, write) = UnixStream::pair()?;
        let mut flags = Vec::new();
        for signal in FORWARDED {
            let flag = Arc::new(AtomicBool::new(false));
            // The flag first, then the byte: whoever wakes up finds the flag set.
            signal_hook::flag::register(signal as i32, Arc::clone(&flag))?;
            signal_hook::low_level::pipe::register(signal as i32, write.try_clone()?)?;
            flags.push((signal, flag));
        }
        signal_hook::low_level::pipe::register(Signal::SIGCHLD as i32, write)?;
        Ok(WATCH.get_or_init(|| Watch {
            wake: Mutex::new(read),
            flags,
            seen: AtomicBool::new(false),
        }))
    }

    /// Sleeps until a handled signal arrives or `timeout` passes.
    fn wait(&self, timeout: Duration) {
        let Ok(mut wake) = self.wake.lock() else {
            thread::sleep(timeout);
            return;
        };
        let _ = wake.set_read_timeout(Some(timeout.max(Duration::from_millis(1))));
        let mut buf = [0u8; 256];
        let _ = wake.read(&mut buf);
    }

    /// The forwarded signals that arrived since the last call.
    fn take(&self) -> Vec<Signal> {
        let taken: Vec<Signal> = self
            .flags
            .iter()
            .filter(|(_, flag)| flag.swap(false, Ordering::SeqCst))
            .map(|(signal, _)| *signal)
            .collect();
        if !taken.is_empty() {
            self.seen.store(true, Ordering::SeqCst);
        }
        taken
    }
}

/// Whether SIGINT, SIGTERM or SIGHUP has arrived since this process started its first
/// launch (for callers that run several launches in a row and should stop).
pub fn interrupted() -> bool {
    Watch::get().is_ok_and(|w| {
        w.seen.load(Ordering::SeqCst) || w.flags.iter().any(|(_, f)| f.load(Ordering::SeqCst))
    })
}

/// Starts `jobs` and supervises them until all have exited: output is copied line by line
/// (prefixed when asked), forwarded signals reach every job, and when a job fails the
/// others get [`RunOptions::grace`] to exit, then SIGTERM, then SIGKILL after
/// [`RunOptions::kill_after`]. A third forwarded signal kills every job at once.
///
/// # Errors
///
/// The signal handlers cannot be installed, or a job cannot be started (those already
/// started are ended first).
pub fn run_jobs(jobs: Vec<Job>, options: &RunOptions) -> Result<Outcome, LaunchError> {
    run_jobs_removing(jobs, options, None)
}

/// Sets `command` up to run as a supervised child: its stdout and stderr piped, its stdin
/// piped when `stdin` (else null), the leader of its own process group (so that signals reach
/// it and what it starts, not it twice through the terminal), and, on Linux, killed by the
/// parent-death signal when the thread that spawns it ends.
pub(crate) fn prepare_child(command: &mut Command, stdin: bool) {
    command
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    ffi::process::kill_when_parent_dies(command);
}

/// [`run_jobs`], where the launch's temporary `folder` is removed by the guardian if the
/// launcher dies. Jobs die with the launcher, however it dies: on Linux each gets the
/// parent-death signal (SIGKILL), and everywhere a [`Guardian`] kills their process groups.
fn run_jobs_removing(
    jobs: Vec<Job>,
    options: &RunOptions,
    folder: Option<&Path>,
) -> Result<Outcome, LaunchError> {
    let watch = Watch::get().map_err(LaunchError::Prepare)?;
    let mut guardian = match Guardian::start(folder) {
        Ok(guardian) => Some(guardian),
        Err(e) => {
            eprintln!(
                "[{}] warning: cannot start the guardian process ({e}): if this launcher is \
                 killed, its ranks may outlive it",
                options.name
            );
            None
        }
    };
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut running: Vec<Running> = Vec::with_capacity(jobs.len());
    let mut inputs: Vec<mpsc::Sender<Vec<u8>>> = Vec::new();
    let mut readers = 0usize;
    for mut job in jobs {
        // The spawning thread is the one that supervises until every job is reaped, so the
        // parent-death signal (tied to the thread on Linux) fires only when the launcher dies.
        prepare_child(&mut job.command, options.forward_stdin || job.remote);
        let mut child = match job.command.spawn() {
            Ok(child) => child,
            Err(source) => {
                let mut helpers = Vec::new();
                for r in &mut running {
                    r.signal(Signal::SIGKILL, &mut helpers);
                    let _ = r.child.wait();
                }
                if let Some(guardian) = guardian {
                    guardian.dismiss();
                }
                return Err(LaunchError::Spawn {
                    rank: job.rank,
                    program: job.command.get_program().to_string_lossy().into_owned(),
                    source,
                });
            }
        };
        if let Some(guardian) = &mut guardian {
            guardian.watch(child.id());
        }
        if options.verbose {
            eprintln!(
                "[{}] rank {} started on {} (pid {})",
                options.name,
                job.rank,
                job.host,
                child.id()
            );
        }
        let prefix = if options.prefix_output {
            format!("[{}] ", job.rank)
        } else {
            String::new()
        };
        let pidfile = Arc::new(Mutex::new(None));
        if let Some(out) = child.stdout.take() {
            let (prefix, done, slot) = (prefix.clone(), done_tx.clone(), Arc::clone(&pidfile));
            let remote = job.remote;
            thread::spawn(move || {
                copy_lines(out, Sink::Stdout, &prefix, remote, remote.then_some(&slot));
                let _ = done.send(());
            });
            readers += 1;
        }
        if let Some(err) = child.stderr.take() {
            let done = done_tx.clone();
            let remote = job.remote;
            thread::spawn(move || {
                copy_lines(err, Sink::Stderr, &prefix, remote, None);
                let _ = done.send(());
            });
            readers += 1;
        }
        let mut terminal = None;
        if let Some(mut stdin) = child.stdin.take() {
            let (tx, rx) = mpsc::channel::<Vec<u8>>();
            thread::spawn(move || {
                for chunk in rx {
                    if stdin
                        .write_all(&chunk)
                        .and_then(|()| stdin.flush())
                        .is_err()
                    {
                        break;
                    }
                }
            });
            if options.forward_stdin {
                inputs.push(tx.clone());
            }
            if job.remote {
                terminal = Some(tx);
            }
        }
        running.push(Running {
            rank: job.rank,
            host: job.host,
            remote: job.remote,
            child,
            status: None,
            pidfile,
            terminal,
        });
    }
    drop(done_tx);
    if !inputs.is_empty() && stdin_is_ours() {
        // Detached: it may block on the launcher's stdin after the launch ends.
        thread::spawn(move || broadcast_stdin(inputs));
    }
    let outcome = supervise(&mut running, watch, options, guardian.as_mut());
    if let Some(guardian) = guardian {
        guardian.dismiss();
    }
    // Output still in the pipes is copied before returning; a process that inherited a
    // rank's output and lives on must not hold the launcher, so the wait is bounded.
    let deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..readers {
        let left = deadline.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    Ok(outcome)
}

/// Waits for every job, forwarding signals and ending the others after a failure.
fn supervise(
    running: &mut [Running],
    watch: &Watch,
    options: &RunOptions,
    mut guardian: Option<&mut Guardian>,
) -> Outcome {
    let mut outcome: Option<Outcome> = None;
    let mut ended: Vec<usize> = Vec::new();
    let mut helpers: Vec<Child> = Vec::new();
    let mut forwarded = 0usize;
    let mut ending: Option<Ending> = None;
    let mut order: VecDeque<usize> = (0..running.len()).collect();
    loop {
        for signal in watch.take() {
            forwarded += 1;
            let signal = if forwarded >= 3 {
                Signal::SIGKILL
            } else {
                signal
            };
            if options.verbose {
                eprintln!("[{}] forwarding {signal} to every rank", options.name);
            }
            if outcome.is_none() {
                outcome = Some(Outcome::Interrupted { signal });
            }
            for r in running.iter_mut() {
                r.signal(signal, &mut helpers);
            }
        }
        // Reap in a rotating order so that no rank's exit is always noticed first.
        let mut exited_now = false;
        for _ in 0..order.len() {
            let i = order[0];
            order.rotate_left(1);
            let r = &mut running[i];
            if r.status.is_some() {
                continue;
            }
            let Ok(Some(status)) = r.child.try_wait() else {
                continue;
            };
            r.status = Some(status);
            if let Some(guardian) = guardian.as_deref_mut() {
                guardian.forget(r.child.id());
            }
            exited_now = true;
            if options.verbose {
                eprintln!("[{}] rank {} exited: {status}", options.name, r.rank);
            }
            if !status.success() && outcome.is_none() {
                outcome = Some(Outcome::RankFailed {
                    rank: r.rank,
                    host: r.host.clone(),
                    status,
                    ended: Vec::new(),
                });
            }
        }
        if running.iter().all(|r| r.status.is_some()) {
            break;
        }
        // A ring cannot go on without a rank: once one has exited after a failure or an
        // interruption, the others are ended too.
        if outcome.is_some() && ending.is_none() && exited_now {
            ending = Some(Ending::Grace(Instant::now()));
        }
        let now = Instant::now();
        let timeout = match ending {
            None | Some(Ending::Killed) => Duration::from_secs(1),
            Some(Ending::Grace(since)) if now < since + options.grace => {
                since + options.grace - now
            }
            Some(Ending::Grace(_)) => {
                for r in running.iter_mut().filter(|r| r.status.is_none()) {
                    ended.push(r.rank);
                    if options.verbose {
                        eprintln!("[{}] ending rank {}", options.name, r.rank);
                    }
                    r.signal(Signal::SIGTERM, &mut helpers);
                }
                ending = Some(Ending::Terminated(now));
                options.kill_after
            }
            Some(Ending::Terminated(at)) if now < at + options.kill_after => {
                at + options.kill_after - now
            }
            Some(Ending::Terminated(_)) => {
                for r in running.iter_mut() {
                    r.signal(Signal::SIGKILL, &mut helpers);
                }
                ending = Some(Ending::Killed);
                Duration::from_secs(1)
            }
        };
        watch.wait(timeout);
    }
    for mut helper in helpers {
        let _ = helper.wait();
    }
    ended.sort_unstable();
    match outcome {
        Some(Outcome::RankFailed {
            rank, host, status, ..
        }) => Outcome::RankFailed {
            rank,
            host,
            status,
            ended,
        },
        Some(other) => other,
        None => Outcome::Success,
    }
}

/// How far ending the other ranks has gone.
#[derive(Clone, Copy)]
enum Ending {
    /// Waiting since then for them to exit on their own.
    Grace(Instant),
    /// Sent SIGTERM then.
    Terminated(Instant),
    /// Sent SIGKILL.
    Killed,
}

#[derive(Clone, Copy)]
enum Sink {
    Stdout,
    Stderr,
}

/// Copies a job's output line by line with `prefix`, holding the launcher's stream for a
/// whole line so that ranks' lines never interleave. Bytes pass through as they are (no
/// UTF-8 required). A remote terminal ends lines with `\r\n`, which becomes `\n`; its first
/// line, when it is the PID-file line, goes to `pidfile` instead.
fn copy_lines(
    stream: impl Read,
    sink: Sink,
    prefix: &str,
    remote: bool,
    pidfile: Option<&Arc<Mutex<Option<String>>>>,
) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    let mut first = true;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if remote && line.ends_with(b"\r\n") {
            line.truncate(line.len() - 2);
            line.push(b'\n');
        }
        if std::mem::take(&mut first)
            && let Some(slot) = pidfile
            && let Some(path) = line.strip_prefix(PIDFILE_MARKER.as_bytes())
        {
            let path = String::from_utf8_lossy(path).trim().to_string();
            if let Ok(mut slot) = slot.lock() {
                *slot = Some(path);
            }
            continue;
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        // Write errors (the launcher's output closed) are ignored: the job's output is
        // still drained so that it never blocks on a full pipe.
        let _ = match sink {
            Sink::Stdout => write_line(&mut io::stdout().lock(), prefix, &line),
            Sink::Stderr => write_line(&mut io::stderr().lock(), prefix, &line),
        };
    }
}

fn write_line(out: &mut impl Write, prefix: &str, line: &[u8]) -> io::Result<()> {
    out.write_all(prefix.as_bytes())?;
    out.write_all(line)?;
    out.flush()
}

/// Whether reading standard input is safe: a launcher started in the background of an
/// interactive shell would be stopped (SIGTTIN) by reading its terminal, so then the ranks
/// get no input.
fn stdin_is_ours() -> bool {
    let stdin = io::stdin();
    !stdin.is_terminal() || tcgetpgrp(&stdin).is_ok_and(|foreground| foreground == getpgrp())
}

/// Copies the launcher's standard input to every job until it ends; then local jobs see
/// the end of their input.
fn broadcast_stdin(inputs: Vec<mpsc::Sender<Vec<u8>>>) {
    let mut stdin = io::stdin().lock();
    let mut buf = vec![0u8; 8192];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                for input in &inputs {
                    let _ = input.send(buf[..n].to_vec());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

/// The launcher's terminal size as `mlx.launch` reads it (Python's
/// `shutil.get_terminal_size`): `COLUMNS` and `LINES` from the environment when set,
/// else the size of the terminal on standard output; 0 for what is unknown.
pub fn terminal_dimensions() -> (u16, u16) {
    let from_env = |var: &str| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.trim().parse::<u16>().ok())
            .filter(|&v| v > 0)
    };
    let (mut columns, mut lines) = (from_env("COLUMNS"), from_env("LINES"));
    if (columns.is_none() || lines.is_none())
        && let Some((terminal_size::Width(w), terminal_size::Height(h))) =
            terminal_size::terminal_size_of(io::stdout())
    {
        columns = columns.or(Some(w));
        lines = lines.or(Some(h));
    }
    (columns.unwrap_or(0), lines.unwrap_or(0))
}
