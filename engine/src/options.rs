//! How a group is formed: the timeout every wait is bounded by, and (with the
//! authentication work) a pre-shared key.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::auth::Secret;
use crate::error::{Error, Result};

/// How many calls a group records unless told otherwise ([`Options::flight_records`]).
/// A record is 104 bytes (on 64-bit targets), so the default ring takes 208 KiB per group,
/// allocated when it forms.
pub const DEFAULT_FLIGHT_RECORDS: usize = 2048;

/// The most calls a group may keep (109 MB of records): more is refused when the
/// group forms, so that no value of [`Options::flight_records`] can exhaust memory.
pub const MAX_FLIGHT_RECORDS: usize = 1 << 20;

/// The most threads a keyed native group seals and opens its records on
/// ([`Options::seal_threads`]): past a handful, one connection's records come faster than
/// the socket takes them.
pub const MAX_SEAL_THREADS: usize = 64;

/// The instant `wait` after `start`, for every deadline in the crate.
///
/// A timeout may be anything up to [`Duration::MAX`] (and `NUVEC_DISTRIBUTED_TIMEOUT=1e19`
/// is about 317 billion years), more than an [`Instant`] can hold, where `start + wait`
/// panics. Such a deadline is taken as far enough ahead that no wait reaches it: a century,
/// or the most of that the platform's clock can represent.
pub(crate) fn deadline(start: Instant, wait: Duration) -> Instant {
    const DAY: u64 = 24 * 60 * 60;
    start.checked_add(wait).unwrap_or_else(|| {
        [100 * 365 * DAY, 365 * DAY, DAY, 60]
            .into_iter()
            .find_map(|secs| start.checked_add(Duration::from_secs(secs)))
            // No clock ends within a minute of now; if one did, the wait ends now.
            .unwrap_or(start)
    })
}

/// Options of [`init_with`](crate::init_with).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use nuvec_distributed_engine::{Backend, Options, init_with};
///
/// // The defaults, then only what differs, by builder or by field.
/// let mut options = Options::default().timeout(Duration::from_secs(5));
/// options.spin = Some(Duration::ZERO);
/// assert_eq!(options.timeout, Duration::from_secs(5));
/// assert_eq!(options.backend, Backend::Ring);
/// let group = init_with(&[vec!["127.0.0.1:0".into()]], 0, &options)?;
/// assert_eq!(group.size(), 1);
///
/// // Values no group can use are refused when one is formed.
/// let zero = Options::default().timeout(Duration::ZERO);
/// assert!(init_with(&[vec!["127.0.0.1:0".into()]], 0, &zero).is_err());
/// # Ok::<(), nuvec_distributed_engine::Error>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Options {
    /// How long connecting, and every transfer, may wait for a peer that makes no progress
    /// before failing with an error naming it. Default 30 s ([`TIMEOUT_VAR`](crate::TIMEOUT_VAR), in seconds, for
    /// [`init`](crate::init)). The kernel's own timeouts on each connection (keepalive, and
    /// `TCP_USER_TIMEOUT` on Linux) are derived from it, so a peer that is late by less than
    /// this never fails a collective, whatever its size. Any value above zero is accepted;
    /// one beyond what the clock can represent (up to [`Duration::MAX`]) waits as good as
    /// forever.
    pub timeout: Duration,
    /// The TCP congestion control every connection uses (Linux: `TCP_CONGESTION`), or
    /// `None` (the default) for the system's. On loopback the common default, `bbr`, paces
    /// each stream well below what the machine can move; `"cubic"` or `"reno"` lift large
    /// collectives by about a third on the 2-vCPU VMs this was measured on (compare on your
    /// own machine: `nuvec bench` with `NUVEC_DISTRIBUTED_TCP_CONGESTION` set and unset; the
    /// bench's header names the one in use). Only algorithms in
    /// `/proc/sys/net/ipv4/tcp_allowed_congestion_control` may be chosen without
    /// privileges.
    pub tcp_congestion: Option<String>,
    /// Send and receive buffer size of every connection, in bytes, or `None` (the default)
    /// for the kernel's autotuning, which measured as fast or faster on loopback. Setting
    /// it turns autotuning off for those sockets.
    pub socket_buffer: Option<usize>,
    /// How long a collective that is waiting for a peer keeps retrying before it sleeps in
    /// the kernel: `None` (the default) to learn it, `Some` to fix it
    /// ([`SPIN_VAR`](crate::SPIN_VAR), in microseconds, for [`init`](crate::init)).
    ///
    /// Waking a thread that slept costs ~100 µs on the VMs this was measured on, against a
    /// ~10 µs round trip, so a wait the spin covers is that much shorter, and one it does
    /// not cover costs the whole spin in CPU. Learned, the budget follows the group's last
    /// 32 waits: the 90th percentile of those up to 2 ms, plus a quarter, at least 10 µs and
    /// at most 2 ms, while such waits are at least half of them; else 10 µs. A rank whose
    /// peer reaches each collective ~1 ms after it (a sharded model's layers) keeps
    /// spinning through the wait, and one whose calls come 100 ms apart spins 10 µs per
    /// call. `Some(Duration::ZERO)` never spins (lowest CPU use: a wait sleeps in the
    /// kernel at once). Retries yield the CPU after the first 10 µs, and from the start
    /// when the hostfile puts more ranks on this host than it has CPUs. An idle group
    /// never spins, and spinning counts against [`Options::timeout`]: it ends at the
    /// deadline however long it is set.
    pub spin: Option<Duration>,
    /// Which backend [`init_with`](crate::init_with) forms over its addresses:
    /// [`Backend::Ring`] (the default, MLX's wire) or [`Backend::Native`]
    /// ([`WIRE_VAR`](crate::WIRE_VAR) `native` for [`init`](crate::init)). `Any` is the
    /// ring; `Jaccl` is refused there (JACCL forms from its device file:
    /// `jaccl::init`, feature `jaccl`).
    pub backend: Backend,
    /// [`Backend::Native`] only: whether ranks on one host move data through shared memory (default
    /// `true`; [`SHM_VAR`](crate::SHM_VAR) for [`init`](crate::init)). A group uses it when every rank is on
    /// the same host and offers it; otherwise every link stays TCP. The MLX wire never uses
    /// it.
    pub shared_memory: bool,
    /// The TCP backends' ([`Backend::Ring`], [`Backend::Native`]) event loop on Linux (see
    /// [`Io`]); default [`Io::Auto`].
    pub io: Io,
    /// How many of its last calls a group keeps in its flight recorder (see
    /// [`Group::flight_record`](crate::Group::flight_record)); 0 turns the recorder off.
    /// Default [`DEFAULT_FLIGHT_RECORDS`](crate::DEFAULT_FLIGHT_RECORDS)
    /// ([`FLIGHT_RECORDS_VAR`](crate::FLIGHT_RECORDS_VAR) for [`init`](crate::init)).
    pub flight_records: usize,
    /// The directory a group writes its flight record into when a call fails it, as
    /// `flight-rank<R>.json` and `flight-rank<R>.trace.json`; `None` (the default) for
    /// [`FLIGHT_DIR_VAR`](crate::FLIGHT_DIR_VAR), read when the group forms, and no dump if
    /// that is unset too.
    pub flight_dir: Option<PathBuf>,
    /// Whether SIGUSR1 makes the process write this group's flight record (with that of
    /// every other group alive that opted in) into [`Options::flight_dir`], or a directory
    /// of the process under the system's temporary directory when it names none, saying
    /// where on stderr (a group whose recorder is off has no record to write). Default
    /// `false`; [`FLIGHT_SIGNAL_VAR`](crate::FLIGHT_SIGNAL_VAR) `1` turns it on for every
    /// group of the process. The first group that opts in installs the handler (replacing
    /// SIGUSR1's default action, which ends the process) and a thread that waits for the
    /// signal, both for the life of the process.
    pub flight_signal: bool,
    /// [`Backend::Native`] with a key only: how many threads seal and open the records of
    /// the group's TCP connections, or `None` (the default) for the CPUs this host has per
    /// rank the hostfile puts on it ([`SEAL_THREADS_VAR`](crate::SEAL_THREADS_VAR) for
    /// [`init`](crate::init)). With 1, the rank's own thread does the cipher work, record by
    /// record; with more, a message of several records is sealed and opened in batches on
    /// a pool of that many threads, shared by the group's connections, and the bytes on
    /// the wire are the same. AES-GCM at 2.5-7 GB/s per core is slower than loopback and
    /// than fast links, so the threads matter wherever a rank has cores to spare; where the
    /// ranks already keep every core busy (two ranks on two CPUs), more threads only add
    /// hand-offs. From 1 to [`MAX_SEAL_THREADS`].
    pub seal_threads: Option<usize>,
    /// The pre-shared secret every connection authenticates with (see [`Options::key`]).
    pub(crate) key: Option<Secret>,
}

/// A distributed backend, named as in `mx.distributed.init(backend=...)`, with the native
/// wire beside MLX's.
///
/// The one choice of what a group is made of. [`Backend::Ring`] and [`Backend::Native`]
/// form over the same hostfile and TCP addresses; what differs is the bytes on each
/// connection and whether co-located ranks share memory. Under them sit the options that
/// only those TCP backends read: [`Options::io`] (both) and [`Options::shared_memory`]
/// (native only).
///
/// ```
/// use nuvec_distributed_engine::{Backend, Options};
///
/// assert_eq!(Options::default().backend, Backend::Ring); // MLX's ranks can join
/// let options = Options::default().backend("native".parse()?);
/// assert_eq!(options.backend, Backend::Native); // nuvec ranks only
/// assert_eq!(Backend::Native.to_string(), "native");
/// # Ok::<(), nuvec_distributed_engine::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[derive(strum::Display, strum::EnumString, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase", parse_err_ty = Error, parse_err_fn = unknown_backend)]
pub enum Backend {
    /// The first backend whose launch environment is present: the hostfile's (the ring, or
    /// the native wire when [`WIRE_VAR`](crate::WIRE_VAR) says so), then JACCL. For
    /// [`init_with`](crate::init_with), the ring.
    Any,
    /// MLX's TCP ring ([`HOSTFILE_VAR`](crate::HOSTFILE_VAR), [`RANK_VAR`](crate::RANK_VAR)),
    /// byte for byte: ranks of `mx.distributed` and of this crate share one ring. No
    /// headers: every rank must make the same calls, and a rank that does not gets wrong
    /// data. An all-reduce is `2(P-1)` dependent hops.
    #[default]
    Ring,
    /// The native wire over the same hostfile, between ranks of this crate only: a
    /// handshake per connection, a header per collective (a mismatched call fails every
    /// rank involved, naming both calls), latency-optimal algorithms over connections
    /// between any two ranks, and shared memory between ranks of one host
    /// ([`Options::shared_memory`]).
    Native,
    /// MLX's RDMA backend over Thunderbolt 5 (feature `jaccl`).
    Jaccl,
}

impl Backend {
    /// The backend's name: `"any"`, `"ring"`, `"native"` or `"jaccl"`, as
    /// [`Group::backend`](crate::Group::backend) reports a formed group's.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// [`Backend`]'s `FromStr` error, naming the valid choices.
fn unknown_backend(name: &str) -> Error {
    Error::invalid(format!(
        "unknown backend {name:?}: expected \"any\", \"ring\", \"native\" or \"jaccl\""
    ))
}

/// The event loop that drives a ring's sockets.
///
/// ```
/// use nuvec_distributed_engine::{Io, Options};
///
/// assert_eq!(Options::default().io, Io::Auto);
/// assert_eq!(Options::default().io(Io::Epoll).io, Io::Epoll);
/// assert_eq!("uring".parse::<Io>(), Ok(Io::Uring));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[derive(strum::Display, strum::EnumString, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase", ascii_case_insensitive)]
#[strum(parse_err_ty = String, parse_err_fn = not_an_event_loop)]
pub enum Io {
    /// [`IO_VAR`](crate::IO_VAR) if it is set, else the loop measured faster: epoll (kqueue off Linux),
    /// everywhere for now. io_uring makes fewer system calls (2.2 per 4 B all_sum at P = 2
    /// on the MLX wire against 5.7, 1.06 on the native wire against 2.31) but is not faster
    /// on this project's benchmark machine (medians of five interleaved rounds): at P = 2
    /// on the native wire the same as epoll within noise (1.01x its time at 4 B, 0.98x at
    /// 64 KiB, 1.06x at 1 MiB), on the MLX wire 1.36x at 4 B and 1.65x at 1 MiB, and at
    /// P = 4, four ranks sharing two CPUs, 1.2-1.4x. Choose [`Io::Uring`] by name to use it.
    #[default]
    #[strum(to_string = "auto", serialize = "")]
    Auto,
    /// Readiness through the operating system's poller (epoll on Linux, kqueue on macOS).
    Epoll,
    /// io_uring (Linux). A ring step of a collective of one lane (small arrays; on the
    /// native wire, a round with one message each way) submits its send and receive
    /// together and waits in the kernel for both; with more than two ranks that receive
    /// first takes any TCP urgent byte (a failure notice), in the kernel, so no notice is
    /// lost to it. Other transfers are one non-blocking io_uring operation each, and waits
    /// are io_uring polls. Every operation on a caller's buffer has completed, or been
    /// cancelled and reaped, before the collective returns, on success, error, timeout and
    /// close alike. Forming a group fails, saying why, where the kernel refuses io_uring
    /// (not Linux, `ENOSYS`, `EPERM`, `kernel.io_uring_disabled`): there is no silent
    /// fallback when it is asked for by name.
    #[strum(to_string = "uring", serialize = "io_uring")]
    Uring,
}

impl Io {
    /// The name [`IO_VAR`](crate::IO_VAR) takes: `"auto"`, `"epoll"` or `"uring"`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// [`Io`]'s `FromStr` error: `"auto"` (or empty), `"epoll"` and `"uring"` (or `"io_uring"`)
/// are its names, in any ASCII case.
fn not_an_event_loop(text: &str) -> String {
    format!("{text:?} is not an event loop: use \"auto\", \"epoll\" or \"uring\"")
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            tcp_congestion: None,
            socket_buffer: None,
            spin: None,
            backend: Backend::Ring,
            shared_memory: true,
            io: Io::Auto,
            flight_records: DEFAULT_FLIGHT_RECORDS,
            flight_dir: None,
            flight_signal: false,
            seal_threads: None,
            key: None,
        }
    }
}

/// Writes builder methods of [`Options`]: each takes its argument, stores the value after
/// `=>` in the field of the method's name, and returns the options.
macro_rules! setters {
    ($($(#[$attr:meta])* $field:ident($arg:ident: $ty:ty) => $value:expr;)*) => {
        $(
            $(#[$attr])*
            pub fn $field(mut self, $arg: $ty) -> Self {
                self.$field = $value;
                self
            }
        )*
    };
}

impl Options {
    setters! {
        /// Sets the timeout.
        ///
        /// # Examples
        ///
        /// ```
        /// use std::time::{Duration, Instant};
        /// use nuvec_distributed_engine::{Fault, Options, init_with};
        ///
        /// // Rank 1 of this ring never starts: rank 0 gives up after the timeout, naming it.
        /// # // Two free ports below the ephemeral range (as a launcher would pick them), so that no
        /// # // dial of another example running in parallel can take one.
        /// # let ports = nuvec_tools::testing::free_ports(2, 1);
        /// # let (p0, p1) = (ports[0][0], ports[1][0]);
        /// let nodes = vec![vec![format!("127.0.0.1:{p0}")], vec![format!("127.0.0.1:{p1}")]];
        /// let options = Options::default().timeout(Duration::from_millis(300));
        /// let start = Instant::now();
        /// let err = init_with(&nodes, 0, &options).unwrap_err();
        /// assert!(start.elapsed() >= Duration::from_millis(300));
        /// assert!(start.elapsed() < Duration::from_secs(10));
        /// assert_eq!((err.fault(), err.peer()), (Fault::PeerFailed, Some(1)), "{err}");
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        timeout(timeout: Duration) => timeout;

        /// Authenticates every connection with this pre-shared secret, which must be the same
        /// on every rank and at least 16 bytes long (`NUVEC_DISTRIBUTED_KEY` for
        /// [`init`](crate::init)).
        ///
        /// Each connection then runs a mutual challenge-response before any data flows (see
        /// the crate docs): a host without the key can neither join the ring nor keep a rank
        /// out of it. MLX's ranks do not speak this handshake, so a keyed ring is made of nuvec
        /// ranks only. What the key protects after the handshake depends on the wire: on the
        /// native wire every TCP byte travels in sealed records (AES-256-GCM under keys
        /// of that connection and direction), so altered, injected, replayed or cut bytes fail
        /// the call naming the peer; shared memory between ranks of one host and user is not
        /// sealed. On the MLX wire the traffic after the handshake is **not encrypted** or
        /// authenticated, as MLX's ranks expect; on an untrusted network, run it over a VPN.
        ///
        /// # Examples
        ///
        /// ```
        /// use nuvec_distributed_engine::{Options, init_with};
        ///
        /// // Two ranks with the same key form their ring (one thread each here).
        /// # // Two free ports below the ephemeral range (as a launcher would pick them), so that no
        /// # // dial of another example running in parallel can take one.
        /// # let ports = nuvec_tools::testing::free_ports(2, 1);
        /// # let (p0, p1) = (ports[0][0], ports[1][0]);
        /// let nodes = vec![vec![format!("127.0.0.1:{p0}")], vec![format!("127.0.0.1:{p1}")]];
        /// let options = Options::default().key("a secret of at least sixteen bytes");
        /// std::thread::scope(|s| {
        ///     for rank in 0..2 {
        ///         let (nodes, options) = (&nodes, &options);
        ///         s.spawn(move || {
        ///             let group = init_with(nodes, rank, options).unwrap();
        ///             let mut x = [1u32];
        ///             group.all_sum(&mut x).unwrap();
        ///             assert_eq!(x, [2]);
        ///         });
        ///     }
        /// });
        ///
        /// // A key shorter than 16 bytes is refused before any connection is made.
        /// let short = Options::default().key("too short");
        /// assert!(init_with(&nodes, 0, &short).is_err());
        /// # Ok::<(), Box<dyn std::error::Error>>(())
        /// ```
        key(secret: impl AsRef<[u8]>) => Some(Secret::new(secret.as_ref()));

        /// Sets the TCP congestion control of every connection (see
        /// [`Options::tcp_congestion`]).
        ///
        /// # Examples
        ///
        /// ```
        /// use nuvec_distributed_engine::Options;
        ///
        /// let options = Options::default().tcp_congestion("reno");
        /// assert_eq!(options.tcp_congestion.as_deref(), Some("reno"));
        /// // The default leaves the system's choice alone.
        /// assert_eq!(Options::default().tcp_congestion, None);
        /// ```
        tcp_congestion(algorithm: impl Into<String>) => Some(algorithm.into());

        /// Sets the send and receive buffer size of every connection (see
        /// [`Options::socket_buffer`]).
        ///
        /// # Examples
        ///
        /// ```
        /// use nuvec_distributed_engine::Options;
        ///
        /// let options = Options::default().socket_buffer(4 << 20);
        /// assert_eq!(options.socket_buffer, Some(4 << 20));
        /// assert_eq!(Options::default().socket_buffer, None); // the kernel's autotuning
        /// ```
        socket_buffer(bytes: usize) => Some(bytes);

        /// Sets how long a waiting collective retries before it sleeps: a fixed time, or `None`
        /// to learn it from the group's waits, the default (see [`Options::spin`]).
        ///
        /// # Examples
        ///
        /// ```
        /// use std::time::Duration;
        /// use nuvec_distributed_engine::Options;
        ///
        /// // Never spin: the lowest CPU use, for ranks that share cores with other work.
        /// let options = Options::default().spin(Duration::ZERO);
        /// assert_eq!(options.spin, Some(Duration::ZERO));
        /// // Learned, the default.
        /// assert_eq!(Options::default().spin, None);
        /// assert_eq!(options.spin(None).spin, None);
        /// ```
        spin(spin: impl Into<Option<Duration>>) => spin.into();

        /// Chooses the backend [`init_with`](crate::init_with) forms (see [`Backend`]).
        ///
        /// ```
        /// use nuvec_distributed_engine::{Backend, Options};
        ///
        /// let options = Options::default().backend(Backend::Native);
        /// assert_eq!(options.backend, Backend::Native);
        /// ```
        backend(backend: Backend) => backend;

        /// Turns shared memory between co-located native-wire ranks on (the default) or off
        /// (every link TCP), as [`SHM_VAR`](crate::SHM_VAR) does for [`init`](crate::init).
        ///
        /// ```
        /// use nuvec_distributed_engine::Options;
        ///
        /// assert!(Options::default().shared_memory);
        /// assert!(!Options::default().shared_memory(false).shared_memory);
        /// ```
        shared_memory(on: bool) => on;

        /// Chooses the event loop (see [`Io`]).
        ///
        /// # Examples
        ///
        /// ```
        /// use nuvec_distributed_engine::{Io, Options};
        ///
        /// let options = Options::default().io(Io::Uring);
        /// assert_eq!(options.io, Io::Uring);
        /// ```
        io(io: Io) => io;

        /// Sets how many calls the flight recorder keeps (see [`Options::flight_records`]); 0
        /// turns it off.
        ///
        /// # Examples
        ///
        /// ```
        /// use nuvec_distributed_engine::{DEFAULT_FLIGHT_RECORDS, Options};
        ///
        /// assert_eq!(Options::default().flight_records, DEFAULT_FLIGHT_RECORDS);
        /// assert_eq!(Options::default().flight_records(0).flight_records, 0);
        /// ```
        flight_records(calls: usize) => calls;

        /// Sets the directory the flight record is written into when the group fails (see
        /// [`Options::flight_dir`]).
        ///
        /// # Examples
        ///
        /// ```
        /// use std::path::Path;
        /// use nuvec_distributed_engine::Options;
        ///
        /// let options = Options::default().flight_dir("/tmp/run-7");
        /// assert_eq!(options.flight_dir.as_deref(), Some(Path::new("/tmp/run-7")));
        /// ```
        flight_dir(dir: impl Into<PathBuf>) => Some(dir.into());

        /// Sets whether SIGUSR1 writes the group's flight record (see
        /// [`Options::flight_signal`]).
        ///
        /// # Examples
        ///
        /// ```
        /// use nuvec_distributed_engine::Options;
        ///
        /// assert!(!Options::default().flight_signal);
        /// assert!(Options::default().flight_signal(true).flight_signal);
        /// ```
        flight_signal(on: bool) => on;
    }

    /// How many threads a keyed native group formed with these options seals and opens
    /// its records on, where the hostfile puts `local_ranks` ranks (this one included) on
    /// this host: [`Options::seal_threads`] if set, else this host's CPUs per rank, at
    /// least 1 and at most [`MAX_SEAL_THREADS`].
    ///
    /// ```
    /// use nuvec_distributed_engine::Options;
    ///
    /// let mut options = Options::default();
    /// let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    /// assert_eq!(options.seal_threads_for(1), cpus.min(64));
    /// assert_eq!(options.seal_threads_for(cpus + 1), 1);
    /// options.seal_threads = Some(4);
    /// assert_eq!(options.seal_threads_for(1000), 4);
    /// ```
    pub fn seal_threads_for(&self, local_ranks: usize) -> usize {
        self.seal_threads
            .unwrap_or_else(|| {
                let cpus = std::thread::available_parallelism().map_or(1, usize::from);
                cpus / local_ranks.max(1)
            })
            .clamp(1, MAX_SEAL_THREADS)
    }

    /// Checks values a caller may have set by hand.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.timeout.is_zero() {
            return Err(Error::invalid("Options::timeout must be more than zero"));
        }
        if self.socket_buffer == Some(0) {
            return Err(Error::invalid(
                "Options::socket_buffer must be more than zero bytes",
            ));
        }
        if self.tcp_congestion.as_deref().is_some_and(str::is_empty) {
            return Err(Error::invalid("Options::tcp_congestion names no algorithm"));
        }
        if let Some(secret) = &self.key {
            secret.key()?;
        }
        if let Some(n) = self.seal_threads
            && !(1..=MAX_SEAL_THREADS).contains(&n)
        {
            return Err(Error::invalid(format!(
                "Options::seal_threads is {n}; it takes 1 to {MAX_SEAL_THREADS} threads"
            )));
        }
        if self.flight_records > MAX_FLIGHT_RECORDS {
            return Err(Error::invalid(format!(
                "Options::flight_records is {}; a group keeps at most {} records",
                self.flight_records, MAX_FLIGHT_RECORDS
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use proptest::prelude::*;

    use super::*;
    use crate::comm::progress::WaitPolicy;
    use crate::config::env::{self, KEY_VAR};
    use crate::transport::tcp::socket::{self as tcp, SocketTuning};

    /// Durations from zero to [`Duration::MAX`], with the edges often.
    fn any_duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            Just(Duration::from_secs(10_000_000_000_000_000_000)),
            (0u64..5_000_000).prop_map(Duration::from_micros),
            (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        ]
    }

    fn any_options() -> impl Strategy<Value = Options> {
        (
            any_duration(),
            prop::option::of(any_duration()),
            prop::option::of(prop_oneof![Just(0usize), Just(usize::MAX), any::<usize>()]),
            prop::option::of(prop_oneof![
                Just(String::new()),
                Just("reno".to_string()),
                ".{0,20}"
            ]),
            prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
            prop_oneof![Just(0usize), Just(usize::MAX), 0..2_000_000usize],
        )
            .prop_map(|(timeout, spin, buffer, congestion, key, records)| {
                let mut options = Options::default()
                    .timeout(timeout)
                    .spin(spin)
                    .flight_records(records);
                options.socket_buffer = buffer;
                options.tcp_congestion = congestion;
                if let Some(key) = key {
                    options = options.key(key);
                }
                options
            })
    }

    #[test]
    fn deadlines_saturate_instead_of_overflowing() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(3)),
            now + Duration::from_secs(3)
        );
        for huge in [Duration::MAX, Duration::from_secs(u64::MAX / 2)] {
            let far = deadline(now, huge);
            assert!(
                far >= now + Duration::from_secs(365 * 24 * 3600),
                "{huge:?}"
            );
        }
    }

    #[test]
    fn absurd_timeouts_from_the_environment_are_kept_or_refused_by_name() {
        let huge = env::parse_timeout("1e19").unwrap();
        assert_eq!(huge, Duration::from_secs(10_000_000_000_000_000_000));
        assert!(deadline(Instant::now(), huge) > Instant::now());
        for bad in ["1e-300", "inf", "1e20", "0.0000000000001"] {
            let e = env::parse_timeout(bad).unwrap_err().to_string();
            assert!(e.contains(env::TIMEOUT_VAR) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn the_wire_variable_chooses_the_hostfile_backend() {
        let backend = |value: &str| {
            env::options(&vars(vec![(env::WIRE_VAR, value.to_string())])).map(|o| o.backend)
        };
        assert_eq!(Options::default().backend, Backend::Ring);
        assert_eq!(backend("mlx").unwrap(), Backend::Ring);
        assert_eq!(backend(" Native ").unwrap(), Backend::Native);
        assert_eq!(backend("ring").unwrap(), Backend::Ring);
        let e = backend("jaccl").unwrap_err().to_string();
        assert!(e.contains(env::WIRE_VAR) && e.contains("\"mlx\""), "{e}");
        assert!(env::wire_is_mlx(&vars(vec![(env::WIRE_VAR, "mlx".into())])).unwrap());
        assert!(!env::wire_is_mlx(&vars(vec![(env::WIRE_VAR, "native".into())])).unwrap());
        assert!(!env::wire_is_mlx(&vars(vec![])).unwrap());
        for name in ["any", "ring", "native", "jaccl"] {
            assert_eq!(name.parse::<Backend>().unwrap().name(), name);
        }
        let e = "mlx".parse::<Backend>().unwrap_err().to_string();
        assert!(e.contains("\"native\""), "{e}");
    }

    #[test]
    fn init_with_forms_tcp_backends_only() {
        let nodes = [
            vec!["127.0.0.1:0".to_string()],
            vec!["127.0.0.1:0".to_string()],
        ];
        let options = Options::default().backend(Backend::Jaccl);
        let e = crate::init_with(&nodes, 0, &options)
            .unwrap_err()
            .to_string();
        assert!(e.contains("jaccl::init"), "{e}");
    }

    /// The lookup of an environment made of `pairs`.
    fn vars(pairs: Vec<(&'static str, String)>) -> impl Fn(&str) -> Option<OsString> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    /// Values of the numeric variables: numbers of every shape, and anything else.
    fn any_value() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "",
                " ",
                "0",
                "-0",
                "1e19",
                "1e-300",
                "inf",
                "-inf",
                "NaN",
                "1e308",
                "18446744073709551615",
                "18446744073709551616",
                "4294967296",
                "0.0000000001",
                "1.5",
                "-3",
                " 30 ",
            ])
            .prop_map(String::from),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| f.to_string()),
            ".{0,12}",
        ]
    }

    /// Everything an option feeds before any peer is waited for: validation, a group of
    /// one, the derived socket values (applied to real sockets: the kernel accepts them),
    /// the spin policy and deadlines. None of it may panic, whatever the values.
    fn check_options(options: &Options) -> std::result::Result<(), TestCaseError> {
        let valid = options.validate();
        let single = crate::init_with(&[vec!["127.0.0.1:1".into()]], 0, options);
        prop_assert_eq!(valid.is_ok(), single.is_ok());
        let tuning = SocketTuning::from_options(options);
        let now = Instant::now();
        prop_assert!(deadline(now, options.timeout) >= now);
        let _ = WaitPolicy::for_local_ranks(options.spin, 4).spin();
        if let Ok(listener) = tcp::listen("127.0.0.1:0".parse().unwrap(), &tuning) {
            let addr = listener.local_addr().unwrap();
            let stream = tcp::dial(addr, &tuning);
            if valid.is_ok() && options.tcp_congestion.is_none() {
                let stream = stream.map_err(|e| TestCaseError::fail(format!("dial: {e}")))?;
                let tuned = tcp::tune_established(&stream, &tuning.liveness);
                prop_assert!(tuned.is_ok(), "{:?}: {:?}", options, tuned);
            }
        } else {
            prop_assert!(options.tcp_congestion.is_some(), "{:?}", options);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn no_option_value_panics(options in any_options()) {
            let valid = options.validate();
            let expected = !options.timeout.is_zero()
                && options.flight_records <= MAX_FLIGHT_RECORDS
                && options.socket_buffer != Some(0)
                && options.tcp_congestion.as_deref() != Some("")
                && options.key.as_ref().is_none_or(|k| k.key().is_ok());
            prop_assert_eq!(valid.is_ok(), expected, "{:?}", valid);
            check_options(&options)?;
        }

        #[test]
        fn no_environment_value_panics(
            timeout in any_value(),
            spin in any_value(),
            buffer in any_value(),
            congestion in prop_oneof![Just("reno".to_string()), ".{0,8}"],
            key in ".{0,24}",
        ) {
            let lookup = vars(vec![
                (env::TIMEOUT_VAR, timeout.clone()),
                (env::SPIN_VAR, spin),
                (env::SOCKET_BUFFER_VAR, buffer),
                (env::TCP_CONGESTION_VAR, congestion),
                (KEY_VAR, key),
            ]);
            if let Ok(options) = env::options(&lookup) {
                prop_assert!(!options.timeout.is_zero(), "{:?} read as zero", timeout);
                check_options(&options)?;
            }
            if let Ok(t) = env::parse_timeout(&timeout) {
                prop_assert!(!t.is_zero());
            }
        }
    }
}
