//! Starting a ring of local processes the way `mlx.launch` does: a hostfile on 127.0.0.1,
//! `MLX_HOSTFILE` and `MLX_RANK` in each rank's environment, output prefixed by rank, and
//! when one rank fails, the others ended and the failure reported with its rank.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::Duration;

/// A ring of processes on this machine.
#[derive(Clone, Debug)]
pub struct LocalRing {
    /// Number of ranks.
    pub ranks: usize,
    /// Connections between neighbours (addresses per rank in the hostfile).
    pub connections: usize,
    /// First port; consecutive ports follow, one per address, as `mlx.launch` assigns them.
    /// `None` picks free ports.
    pub starting_port: Option<u16>,
    /// Extra environment for every rank.
    pub env: Vec<(String, String)>,
    /// Prefix each output line with its rank.
    pub prefix_output: bool,
}

/// How a launched ring ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every rank exited successfully.
    Success,
    /// This rank failed first (its exit status); the others were ended.
    RankFailed {
        /// The rank.
        rank: usize,
        /// How it exited.
        status: ExitStatus,
    },
}

/// Why a ring could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// No ports could be reserved or the hostfile not written.
    #[error("preparing the ring: {0}")]
    Prepare(#[source] std::io::Error),
    /// A rank's process could not be started.
    #[error("starting rank {rank} ({program}): {source}")]
    Spawn {
        /// The rank.
        rank: usize,
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl LocalRing {
    /// A ring of `ranks` local processes with one connection between neighbours.
    pub fn new(ranks: usize) -> Self {
        Self {
            ranks,
            connections: 1,
            starting_port: None,
            env: Vec::new(),
            prefix_output: true,
        }
    }

    /// The hostfile's address lists: per rank, `connections` addresses on 127.0.0.1.
    pub fn addresses(&self) -> std::io::Result<Vec<Vec<String>>> {
        let ports: Vec<u16> = match self.starting_port {
            Some(first) => (0..self.ranks * self.connections)
                .map(|i| {
                    u16::try_from(usize::from(first) + i).map_err(|_| {
                        std::io::Error::other(format!("port {first} + {i} is past 65535"))
                    })
                })
                .collect::<std::io::Result<_>>()?,
            None => {
                // Hold every listener until all are chosen, so no port is handed out twice.
                let held: Vec<TcpListener> = (0..self.ranks * self.connections)
                    .map(|_| TcpListener::bind("127.0.0.1:0"))
                    .collect::<std::io::Result<_>>()?;
                held.iter()
                    .map(|l| l.local_addr().map(|a| a.port()))
                    .collect::<std::io::Result<_>>()?
            }
        };
        Ok(ports
            .chunks(self.connections)
            .map(|c| c.iter().map(|p| format!("127.0.0.1:{p}")).collect())
            .collect())
    }

    /// Runs `program args...` as every rank and waits for all of them. When a rank fails,
    /// the others are ended (only the processes started here, by their handles).
    pub fn run(&self, program: &Path, args: &[OsString]) -> Result<Outcome, LaunchError> {
        let dir = tempfile::tempdir().map_err(LaunchError::Prepare)?;
        let hostfile = dir.path().join("hostfile.json");
        let addresses = self.addresses().map_err(LaunchError::Prepare)?;
        let text = serde_json::to_string(&addresses).map_err(|e| LaunchError::Prepare(e.into()))?;
        std::fs::write(&hostfile, text).map_err(LaunchError::Prepare)?;
        let children = self.spawn_all(program, args, &hostfile)?;
        Ok(self.supervise(children))
    }

    fn spawn_all(
        &self,
        program: &Path,
        args: &[OsString],
        hostfile: &PathBuf,
    ) -> Result<Vec<Child>, LaunchError> {
        let mut children: Vec<Child> = Vec::with_capacity(self.ranks);
        for rank in 0..self.ranks {
            let spawned = Command::new(program)
                .args(args)
                .env("MLX_HOSTFILE", hostfile)
                .env("MLX_RANK", rank.to_string())
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            match spawned {
                Ok(child) => children.push(child),
                Err(source) => {
                    for mut c in children {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                    return Err(LaunchError::Spawn {
                        rank,
                        program: program.display().to_string(),
                        source,
                    });
                }
            }
        }
        Ok(children)
    }

    fn supervise(&self, mut children: Vec<Child>) -> Outcome {
        let mut forwarders = Vec::new();
        for (rank, child) in children.iter_mut().enumerate() {
            let prefix = if self.prefix_output {
                format!("[{rank}] ")
            } else {
                String::new()
            };
            if let Some(out) = child.stdout.take() {
                let p = prefix.clone();
                forwarders.push(thread::spawn(move || forward(out, &p, false)));
            }
            if let Some(err) = child.stderr.take() {
                forwarders.push(thread::spawn(move || forward(err, &prefix, true)));
            }
        }
        let mut outcome = Outcome::Success;
        let mut statuses: Vec<Option<ExitStatus>> = vec![None; children.len()];
        while statuses.iter().any(Option::is_none) {
            let mut failed = None;
            for (rank, child) in children.iter_mut().enumerate() {
                if statuses[rank].is_none()
                    && let Ok(Some(status)) = child.try_wait()
                {
                    statuses[rank] = Some(status);
                    if !status.success() && failed.is_none() {
                        failed = Some((rank, status));
                    }
                }
            }
            if let (Some((rank, status)), Outcome::Success) = (failed, &outcome) {
                outcome = Outcome::RankFailed { rank, status };
                // The ring cannot finish without this rank. Give the others a moment to
                // report their own view of the failure, then end those still running:
                // only processes started here, through their handles, so an exited
                // child's PID can never be reused under us.
                thread::sleep(Duration::from_millis(500));
                for (other, c) in children.iter_mut().enumerate() {
                    if statuses[other].is_none() && matches!(c.try_wait(), Ok(None)) {
                        let _ = c.kill();
                    }
                }
            }
            thread::sleep(Duration::from_millis(10));
        }
        for f in forwarders {
            let _ = f.join();
        }
        outcome
    }
}

/// Copies a child's output line by line, with `prefix`.
fn forward(stream: impl std::io::Read, prefix: &str, to_stderr: bool) {
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { break };
        if to_stderr {
            let _ = writeln!(std::io::stderr().lock(), "{prefix}{line}");
        } else {
            let _ = writeln!(std::io::stdout().lock(), "{prefix}{line}");
        }
    }
}
