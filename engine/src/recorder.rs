//! The flight recorder: every group keeps its last calls in a ring buffer of fixed size,
//! allocated once when the group forms, so that when a job fails or hangs each rank can say
//! what it was doing (see [`Group::flight_record`](crate::Group::flight_record)).
//!
//! Every collective and point-to-point call that reaches the backend's
//! [`Communicator`] passes through [`Recorded`]: the group's blocking calls and the loop
//! thread's nonblocking ones alike, each with its element type. A call takes the
//! recorder's lock twice, to write its record when it starts (so that a copy taken while
//! it hangs shows it running) and to write its end and outcome when it returns; nothing is
//! allocated per call, and a call's algorithm and transport, which follow from what it is,
//! are worked out only when a copy is taken. A group whose capacity is 0 takes no lock and
//! records nothing. A group that opts in also writes its record on SIGUSR1 (`signal`).
//!
//! A call's two times are the CPU's counter as it read it ([`Clock`]: the time-stamp
//! counter on x86-64 with an invariant one, the system counter on aarch64, else the
//! monotonic clock), turned into nanoseconds when a copy is taken. Reading the counter
//! costs 11 ns where `Instant::now` costs 28 (this x86-64 VM, 10^7 reads each), and the
//! recorder reads twice per call: on shared memory's 4 B all_sum at P = 2, a call of about
//! 0.3 µs, the recorder's clock reads were half its cost.

mod signal;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

pub use crate::comm::FlightOp;
use crate::comm::algorithm::Algorithm;
use crate::comm::{Communicator, Transport};
use crate::element::DType;
use crate::error::{Error, Fault, Result};
use crate::options::{MAX_FLIGHT_RECORDS, Options};
use crate::reduce::ReduceOp;

/// How a recorded call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlightOutcome {
    /// The call had not returned when the record was taken.
    Running,
    /// The call returned `Ok`.
    Ok,
    /// The call returned an error.
    Failed {
        /// The error's variant, as [`Error`] names it (`"Timeout"`, `"Mismatch"`, ...).
        kind: &'static str,
        /// Whose fault the error is.
        fault: Fault,
        /// The peer the error blames, if any ([`Error::peer`]).
        peer: Option<usize>,
    },
}

/// One recorded call.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct FlightEntry {
    /// The call's number in this group, from 0: the k-th call of every rank pairs with the
    /// k-th of every other (point-to-point calls count on the ranks that make them).
    pub seq: u64,
    /// What the call was.
    pub op: FlightOp,
    /// The element type; `None` for a barrier, and for a call made on the group's
    /// [`Communicator`] directly, which passes bytes only (see [`Group::new`](crate::Group::new)).
    pub dtype: Option<DType>,
    /// The length of the call's buffer in bytes: the data reduced or sent, the input of a
    /// gather, scatter or all_to_all.
    pub bytes: u64,
    /// The peer of a send or receive, the root of a broadcast.
    pub peer: Option<usize>,
    /// The algorithm the backend took for it ([`Communicator::algorithm`]); `None` for a
    /// send or receive, a group of one, and a backend that does not say.
    pub algorithm: Option<Algorithm>,
    /// What carries the call: the link to [`FlightEntry::peer`] for a send or receive,
    /// else the link every peer shares, or `None` when links to different peers differ
    /// (shared memory on this host, TCP to others).
    pub transport: Option<Transport>,
    /// When the call started, in nanoseconds since the group formed.
    pub start_ns: u64,
    /// When it returned, in nanoseconds since the group formed; `None` while it runs.
    pub end_ns: Option<u64>,
    /// How it ended.
    pub outcome: FlightOutcome,
}

impl FlightEntry {
    /// The number of elements, when the element type is known.
    pub fn count(&self) -> Option<u64> {
        self.dtype.map(|d| self.bytes / d.size() as u64)
    }
}

/// A copy of a group's flight recorder: its last calls, oldest first, with what is needed
/// to line up the dumps of different ranks. See
/// [`Group::flight_record`](crate::Group::flight_record).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct FlightRecord {
    /// This rank.
    pub rank: usize,
    /// The number of ranks.
    pub size: usize,
    /// The backend's name ([`Group::backend`](crate::Group::backend)), which is the wire.
    pub backend: &'static str,
    /// How many calls the recorder keeps (0: it is off).
    pub capacity: usize,
    /// When the group formed, in nanoseconds since the Unix epoch (this host's clock):
    /// every `*_ns` time is relative to it.
    pub formed_unix_ns: u64,
    /// When this copy was taken, in nanoseconds since the group formed.
    pub taken_ns: u64,
    /// How many calls the group has started; the records are the last
    /// `min(calls, capacity)` of them.
    pub calls: u64,
    /// The recorded calls, oldest first.
    pub entries: Vec<FlightEntry>,
}

impl FlightRecord {
    /// The record as JSON: the fields of [`FlightRecord`], and per entry its fields with
    /// names for the enums (`"op": "all_sum"`, `"dtype": "float32"`, `"algorithm":
    /// "ring"` or `null`, `"outcome": "ok"`, `"running"` or `"failed"` with an `"error"`
    /// object of `kind`, `fault` and `peer`).
    /// `nuvec flight` reads it.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// group.all_sum(&mut [1.0f32; 4])?;
    /// let json: serde_json::Value = serde_json::from_str(&group.flight_record().to_json())
    ///     .expect("the record is JSON");
    /// assert_eq!(json["rank"], group.rank());
    /// let last = json["entries"].as_array().and_then(|e| e.last()).expect("a call");
    /// assert_eq!((&last["op"], &last["dtype"]), (&"all_sum".into(), &"float32".into()));
    /// assert_eq!((&last["count"], &last["outcome"]), (&4.into(), &"ok".into()));
    /// # Ok(()) });
    /// ```
    pub fn to_json(&self) -> String {
        let entries: Vec<Value> = self.entries.iter().map(entry_json).collect();
        let record = json!({
            "rank": self.rank,
            "size": self.size,
            "backend": self.backend,
            "capacity": self.capacity,
            "formed_unix_ns": self.formed_unix_ns,
            "taken_ns": self.taken_ns,
            "calls": self.calls,
            "entries": entries,
        });
        // A `Value` always serializes.
        serde_json::to_string_pretty(&record).unwrap_or_default()
    }

    /// The record as a Chrome trace (the Trace Event Format that `chrome://tracing` and
    /// Perfetto open): one complete (`"X"`) event per call, in the process `pid` = rank,
    /// on the Unix time line in microseconds so that the traces of different ranks line up
    /// when loaded together (as far as the hosts' clocks agree). A call still running
    /// lasts until the record was taken. Each event's `args` are the entry's JSON fields
    /// but the op (its name): the algorithm among them.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// group.all_gather_vec(&[1u8])?;
    /// let trace: serde_json::Value = serde_json::from_str(&group.flight_record().to_chrome_trace())
    ///     .expect("the trace is JSON");
    /// let last = trace["traceEvents"].as_array().and_then(|e| e.last()).expect("a call");
    /// assert_eq!((&last["name"], &last["ph"]), (&"all_gather".into(), &"X".into()));
    /// assert_eq!(last["pid"], group.rank());
    /// # Ok(()) });
    /// ```
    pub fn to_chrome_trace(&self) -> String {
        let micros = |ns: u64| (self.formed_unix_ns as f64 + ns as f64) / 1000.0;
        let mut events = Vec::with_capacity(self.entries.len() + 1);
        events.push(json!({
            "name": "process_name",
            "ph": "M",
            "pid": self.rank,
            "args": { "name": format!("rank {}", self.rank) },
        }));
        for e in &self.entries {
            let end = e.end_ns.unwrap_or(self.taken_ns.max(e.start_ns));
            let mut args = entry_json(e);
            if let Value::Object(map) = &mut args {
                map.remove("op");
            }
            events.push(json!({
                "name": e.op.name(),
                "cat": self.backend,
                "ph": "X",
                "ts": micros(e.start_ns),
                "dur": (end - e.start_ns) as f64 / 1000.0,
                "pid": self.rank,
                "tid": 0,
                "args": args,
            }));
        }
        let trace = json!({ "traceEvents": events, "displayTimeUnit": "ns" });
        serde_json::to_string(&trace).unwrap_or_default()
    }

    /// Writes [`FlightRecord::to_json`] to `dir/flight-rank<R>.json` and
    /// [`FlightRecord::to_chrome_trace`] to `dir/flight-rank<R>.trace.json` (R = the rank),
    /// creating `dir` if needed, and returns the two paths.
    ///
    /// # Errors
    ///
    /// [`Error::Local`] naming the path that could not be created or written.
    ///
    /// # Examples
    ///
    /// ```
    /// use nuvec_distributed_engine::Group;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let [json, trace] = Group::single().flight_record().write(dir.path())?;
    /// assert!(json.ends_with("flight-rank0.json") && trace.exists());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self, dir: &Path) -> Result<[PathBuf; 2]> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::local(format!("creating {}", dir.display()), e))?;
        let json = dir.join(format!("flight-rank{}.json", self.rank));
        let trace = dir.join(format!("flight-rank{}.trace.json", self.rank));
        for (path, text) in [(&json, self.to_json()), (&trace, self.to_chrome_trace())] {
            std::fs::write(path, text)
                .map_err(|e| Error::local(format!("writing {}", path.display()), e))?;
        }
        Ok([json, trace])
    }
}

/// One entry as JSON (see [`FlightRecord::to_json`]).
fn entry_json(e: &FlightEntry) -> Value {
    let mut v = json!({
        "seq": e.seq,
        "op": e.op.name(),
        "dtype": e.dtype.map(DType::name),
        "count": e.count(),
        "bytes": e.bytes,
        "peer": e.peer,
        "algorithm": e.algorithm.map(Algorithm::name),
        "transport": e.transport.map_or("mixed", Transport::name),
        "start_ns": e.start_ns,
        "end_ns": e.end_ns,
    });
    let (outcome, error) = match e.outcome {
        FlightOutcome::Running => ("running", Value::Null),
        FlightOutcome::Ok => ("ok", Value::Null),
        FlightOutcome::Failed { kind, fault, peer } => (
            "failed",
            json!({ "kind": kind, "fault": format!("{fault:?}"), "peer": peer }),
        ),
    };
    if let Value::Object(map) = &mut v {
        map.insert("outcome".into(), outcome.into());
        if !error.is_null() {
            map.insert("error".into(), error);
        }
    }
    v
}

/// What a call is, as the group describes it before handing it to the backend.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub(crate) op: FlightOp,
    pub(crate) dtype: Option<DType>,
    pub(crate) bytes: usize,
    pub(crate) peer: Option<usize>,
}

impl Call {
    pub(crate) fn new(op: FlightOp, dtype: Option<DType>, bytes: usize) -> Call {
        Call {
            op,
            dtype,
            bytes,
            peer: None,
        }
    }

    pub(crate) fn with_peer(mut self, peer: usize) -> Call {
        self.peer = Some(peer);
        self
    }
}

/// One call's record as the ring keeps it: its entry, with the times as the counter read
/// them ([`Clock::read`]), turned into [`FlightEntry::start_ns`] and [`FlightEntry::end_ns`]
/// only when a copy is taken (a call reads the counter and stores what it read, nothing
/// more).
/// Its fields are [`FlightEntry`]'s, times aside, but for the algorithm and the transport,
/// which follow from the others (see [`Recorder::entry`]).
#[derive(Clone, Copy)]
struct Kept {
    seq: u64,
    bytes: u64,
    start: u64,
    end: Option<u64>,
    peer: Option<usize>,
    outcome: FlightOutcome,
    op: FlightOp,
    dtype: Option<DType>,
}

/// The ring of records.
struct Ring {
    /// `capacity` records; call `seq` lives in slot `seq % capacity`.
    slots: Box<[Kept]>,
    /// The number of the next call.
    next: u64,
    /// The slot of the next call, `next % capacity`, kept so that no call divides.
    head: usize,
}

/// Where a call's record is, for writing its end.
#[derive(Clone, Copy)]
struct Slot {
    seq: u64,
    index: usize,
}

/// The recorder's clock: a counter cheap to read per call, and the group's start on it and
/// on the monotonic clock, from which a copy scales what the counter read to nanoseconds.
struct Clock {
    counter: quanta::Clock,
    /// The counter when the group formed.
    epoch_count: u64,
    /// The monotonic clock then.
    epoch: Instant,
}

/// A copy's scale from counts to nanoseconds (see [`Clock::scale`]).
struct Scale<'c> {
    clock: &'c Clock,
    /// Nanoseconds per count, as a ratio measured over the group's life so far, or `None`
    /// early in it: then the counter's own calibration.
    ratio: Option<(u128, u128)>,
}

impl Clock {
    /// How long the group must have lived before a copy measures the counter's rate
    /// itself: the two readings it compares are taken tens of nanoseconds apart, an
    /// error of at most 10^-5 after this long. Before it, `quanta`'s calibration (over a
    /// few hundred microseconds when the process first asks, measured 2.2 * 10^-5 off over
    /// 0.5 s here) serves.
    const SELF_SCALED_AFTER: Duration = Duration::from_millis(10);

    fn new() -> Clock {
        let counter = quanta::Clock::new();
        Clock {
            epoch_count: counter.raw(),
            epoch: Instant::now(),
            counter,
        }
    }

    /// The counter now.
    fn read(&self) -> u64 {
        self.counter.raw()
    }

    /// The scale of a copy taken now, and the time it was taken in nanoseconds since the
    /// group formed (as the counter read it). Measured over the whole life of the group
    /// (the counter and the monotonic clock read now, against both at the start), so that
    /// the times of a group that runs for hours do not drift from the monotonic clock's,
    /// which lines up ranks' dumps by their `formed_unix_ns`.
    fn scale(&self) -> (Scale<'_>, u64) {
        let (count, now) = (self.read(), Instant::now());
        let lived = now.saturating_duration_since(self.epoch);
        let counts = count.saturating_sub(self.epoch_count);
        let ratio = (lived >= Self::SELF_SCALED_AFTER && counts > 0)
            .then(|| (lived.as_nanos(), u128::from(counts)));
        let scale = Scale { clock: self, ratio };
        // On the counter too, so that no call's time is after the copy's.
        let taken = scale.ns(count);
        (scale, taken)
    }
}

impl Scale<'_> {
    /// `count`, a reading of the counter, in nanoseconds since the group formed.
    fn ns(&self, count: u64) -> u64 {
        let counts = count.saturating_sub(self.clock.epoch_count);
        match self.ratio {
            Some((ns, per)) => u64::try_from(u128::from(counts) * ns / per).unwrap_or(u64::MAX),
            None => self
                .clock
                .counter
                .delta_as_nanos(self.clock.epoch_count, count),
        }
    }
}

/// A group's flight recorder.
pub(crate) struct Recorder {
    clock: Clock,
    formed_unix_ns: u64,
    rank: usize,
    size: usize,
    backend: &'static str,
    /// The backend, asked for each recorded call's algorithm when a copy is taken (the
    /// answer depends only on what the call is: see [`Communicator::algorithm`]); weak,
    /// so that a copy taken on SIGUSR1 never keeps a dropped group's backend alive.
    comm: Weak<dyn Communicator>,
    /// Per peer, its link (this rank's own slot is `Local`).
    links: Box<[Transport]>,
    /// The link every peer shares, `None` if they differ.
    common: Option<Transport>,
    /// `None` when the capacity is 0.
    ring: Option<Mutex<Ring>>,
    /// Where the record is written when the group fails.
    dump_dir: Option<PathBuf>,
    /// Whether that dump was made (at most one per group).
    dumped: AtomicBool,
}

impl Recorder {
    /// A recorder of `capacity` calls for `comm`, dumping into `dump_dir` on failure.
    pub(crate) fn new(
        comm: &Arc<dyn Communicator>,
        capacity: usize,
        dump_dir: Option<PathBuf>,
    ) -> Recorder {
        let (rank, size) = (comm.rank(), comm.size());
        let links: Box<[Transport]> = (0..size)
            .map(|p| {
                if p == rank {
                    Transport::Local
                } else {
                    comm.transport(p)
                }
            })
            .collect();
        let mut peers = links.iter().enumerate().filter(|&(p, _)| p != rank);
        let first = peers.next().map(|(_, &t)| t);
        let common = match first {
            Some(t) if peers.all(|(_, &u)| u == t) => Some(t),
            Some(_) => None,
            None => Some(Transport::Local),
        };
        // Options are validated before a group forms; the clamp keeps a communicator built
        // around that check from allocating without bound.
        let capacity = capacity.min(MAX_FLIGHT_RECORDS);
        let clock = Clock::new();
        let placeholder = Kept {
            seq: u64::MAX,
            bytes: 0,
            start: clock.epoch_count,
            end: None,
            peer: None,
            outcome: FlightOutcome::Running,
            op: FlightOp::Barrier,
            dtype: None,
        };
        let ring = (capacity > 0).then(|| {
            Mutex::new(Ring {
                slots: vec![placeholder; capacity].into_boxed_slice(),
                next: 0,
                head: 0,
            })
        });
        let formed_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Recorder {
            clock,
            formed_unix_ns,
            rank,
            size,
            backend: comm.backend(),
            comm: Arc::downgrade(comm),
            links,
            common,
            ring,
            dump_dir,
            dumped: AtomicBool::new(false),
        }
    }

    /// The entry of `kept`, with its times since the group formed (`scale`'s); its
    /// algorithm as `comm` names it, its transport as the links say.
    fn entry(
        &self,
        kept: &Kept,
        scale: &Scale<'_>,
        comm: Option<&dyn Communicator>,
    ) -> FlightEntry {
        FlightEntry {
            seq: kept.seq,
            op: kept.op,
            dtype: kept.dtype,
            bytes: kept.bytes,
            peer: kept.peer,
            algorithm: comm.and_then(|c| c.algorithm(kept.op, kept.dtype, kept.bytes as usize)),
            transport: match (kept.op, kept.peer) {
                (FlightOp::Send | FlightOp::Recv, Some(p)) => self.links.get(p).copied(),
                _ => self.common,
            },
            start_ns: scale.ns(kept.start),
            end_ns: kept.end.map(|end| scale.ns(end)),
            outcome: kept.outcome,
        }
    }

    fn lock(ring: &Mutex<Ring>) -> std::sync::MutexGuard<'_, Ring> {
        // A record is plain data written whole under the lock: a panic elsewhere cannot
        // leave one half-written.
        ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the start of `call`; where its record is, or `None` when the recorder is
    /// off. Inline, so that a group whose recorder is off pays one test per call here
    /// and one in [`Recorder::end`], not two calls.
    #[inline]
    fn begin(&self, call: Call) -> Option<Slot> {
        let ring = self.ring.as_ref()?;
        Some(self.write_start(ring, call))
    }

    /// [`Recorder::begin`]'s record, in `ring`.
    #[inline(never)]
    fn write_start(&self, ring: &Mutex<Ring>, call: Call) -> Slot {
        let start = self.clock.read();
        let mut ring = Self::lock(ring);
        let (seq, index) = (ring.next, ring.head);
        ring.next += 1;
        ring.head = if index + 1 == ring.slots.len() {
            0
        } else {
            index + 1
        };
        ring.slots[index] = Kept {
            seq,
            bytes: call.bytes as u64,
            start,
            end: None,
            peer: call.peer,
            outcome: FlightOutcome::Running,
            op: call.op,
            dtype: call.dtype,
        };
        Slot { seq, index }
    }

    /// Records how the call in `slot` ended (unless the ring has moved past it), and dumps
    /// the record when the error failed the group. Inline as [`Recorder::begin`] is.
    #[inline]
    fn end(&self, slot: Option<Slot>, result: &Result<()>) {
        let (Some(slot), Some(ring)) = (slot, self.ring.as_ref()) else {
            return;
        };
        self.write_end(ring, slot, result);
    }

    /// [`Recorder::end`]'s record, in `ring`.
    #[inline(never)]
    fn write_end(&self, ring: &Mutex<Ring>, Slot { seq, index }: Slot, result: &Result<()>) {
        let end = self.clock.read();
        {
            let mut ring = Self::lock(ring);
            if let Some(slot) = ring.slots.get_mut(index).filter(|s| s.seq == seq) {
                slot.end = Some(end);
                slot.outcome = match result {
                    Ok(()) => FlightOutcome::Ok,
                    Err(e) => FlightOutcome::Failed {
                        kind: e.into(),
                        fault: e.fault(),
                        peer: e.peer(),
                    },
                };
            }
        }
        if let Err(e) = result {
            self.dump_on_failure(e);
        }
    }

    /// Writes the record into the dump directory, once per group, when `error` is the one
    /// that failed the group (not a later call's "failed earlier"). A write that fails is
    /// logged, never returned: the caller returns the collective's own error.
    fn dump_on_failure(&self, error: &Error) {
        let Some(dir) = &self.dump_dir else { return };
        if !error.is_fatal() || matches!(error, Error::Failed(_)) {
            return;
        }
        if self.dumped.swap(true, Ordering::AcqRel) {
            return;
        }
        match self.snapshot().write(dir) {
            Ok([json, _]) => log::info!(
                "rank {}: the group failed ({error}); its flight record is in {}",
                self.rank,
                json.display()
            ),
            Err(e) => log::warn!(
                "rank {}: the group failed, and its flight record could not be written: {e}",
                self.rank
            ),
        }
    }

    /// A copy of the records, oldest first.
    pub(crate) fn snapshot(&self) -> FlightRecord {
        // Outside the lock: a group dropped meanwhile drops its backend here.
        let comm = self.comm.upgrade();
        let (capacity, calls, entries, taken_ns) = match &self.ring {
            None => (0, 0, Vec::new(), self.clock.scale().1),
            Some(ring) => {
                let ring = Self::lock(ring);
                let capacity = ring.slots.len();
                // Scaled after the lock is taken, so that no call recorded is later.
                let (scale, taken_ns) = self.clock.scale();
                let entry = |k: &Kept| self.entry(k, &scale, comm.as_deref());
                // Until the ring is full its records are the slots before the head; then
                // the oldest is at the head.
                let entries = if ring.next < capacity as u64 {
                    ring.slots[..ring.head].iter().map(entry).collect()
                } else {
                    let (newer, older) = ring.slots.split_at(ring.head);
                    older.iter().chain(newer).map(entry).collect()
                };
                (capacity, ring.next, entries, taken_ns)
            }
        };
        FlightRecord {
            rank: self.rank,
            size: self.size,
            backend: self.backend,
            capacity,
            formed_unix_ns: self.formed_unix_ns,
            taken_ns,
            calls,
            entries,
        }
    }
}

/// A backend's communicator with the group's recorder in front of every call that moves
/// data. [`Group`](crate::Group) and the loop thread of its nonblocking calls make them
/// through [`Recorded::call`], with the element type; as a [`Communicator`] it records the
/// calls that carry their element type (all_reduce, sum_scatter) with it and the others as
/// bytes.
pub(crate) struct Recorded {
    inner: Arc<dyn Communicator>,
    /// Shared with the registry of groups that write their record on SIGUSR1, which holds
    /// a weak reference (see `signal`).
    recorder: Arc<Recorder>,
}

impl fmt::Debug for Recorded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Recorded {
    /// `inner` with a recorder of `options.flight_records` calls that dumps into
    /// `options.flight_dir`, or [`FLIGHT_DIR_VAR`](crate::FLIGHT_DIR_VAR) when that is
    /// `None`; and on SIGUSR1 when `options.flight_signal` or
    /// [`FLIGHT_SIGNAL_VAR`](crate::FLIGHT_SIGNAL_VAR) says so and the recorder is on.
    pub(crate) fn new(inner: Arc<dyn Communicator>, options: &Options) -> Recorded {
        use crate::config::env;
        let dir = options
            .flight_dir
            .clone()
            .or_else(|| env::flight_dir(&env::process));
        let recorder = Arc::new(Recorder::new(&inner, options.flight_records, dir));
        if recorder.ring.is_some() && (options.flight_signal || env::flight_signal(&env::process)) {
            signal::register(&recorder);
        }
        Recorded { inner, recorder }
    }

    /// Runs `f` on the backend, recorded as `call`.
    pub(crate) fn call(
        &self,
        call: Call,
        f: impl FnOnce(&dyn Communicator) -> Result<()>,
    ) -> Result<()> {
        let Some(slot) = self.recorder.begin(call) else {
            // Off: the backend's result is returned as it is, written once where the
            // caller reads it (a `Result<()>` is the size of `Error`, 104 bytes to copy).
            return f(&*self.inner);
        };
        let result = f(&*self.inner);
        self.recorder.end(Some(slot), &result);
        // `Ok` made afresh, not the whole `Result` (the size of `Error`) copied out.
        result.map_or_else(Err, |()| Ok(()))
    }

    /// The backend's communicator.
    #[cfg(feature = "jaccl")]
    pub(crate) fn inner(&self) -> &Arc<dyn Communicator> {
        &self.inner
    }

    pub(crate) fn recorder(&self) -> &Recorder {
        &self.recorder
    }
}

impl Communicator for Recorded {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    fn all_reduce(&self, op: ReduceOp, dtype: DType, data: &mut [u8]) -> Result<()> {
        let call = Call::new(FlightOp::AllReduce(op), Some(dtype), data.len());
        self.call(call, |c| c.all_reduce(op, dtype, data))
    }
    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        let call = Call::new(FlightOp::AllGather, None, input.len());
        self.call(call, |c| c.all_gather(input, output))
    }
    fn sum_scatter(&self, dtype: DType, input: &[u8], output: &mut [u8]) -> Result<()> {
        let call = Call::new(FlightOp::SumScatter, Some(dtype), input.len());
        self.call(call, |c| c.sum_scatter(dtype, input, output))
    }
    fn send(&self, data: &[u8], dst: usize) -> Result<()> {
        let call = Call::new(FlightOp::Send, None, data.len()).with_peer(dst);
        self.call(call, |c| c.send(data, dst))
    }
    fn recv(&self, data: &mut [u8], src: usize) -> Result<()> {
        let call = Call::new(FlightOp::Recv, None, data.len()).with_peer(src);
        self.call(call, |c| c.recv(data, src))
    }
    fn barrier(&self) -> Result<()> {
        self.call(Call::new(FlightOp::Barrier, None, 0), |c| c.barrier())
    }
    fn health(&self) -> Result<()> {
        self.inner.health()
    }
    fn close(&self) -> Result<()> {
        self.inner.close()
    }
    fn is_closed(&self) -> bool {
        self.inner.is_closed()
    }
    fn transport(&self, peer: usize) -> Transport {
        self.inner.transport(peer)
    }
    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<()> {
        let call = Call::new(FlightOp::Broadcast, None, data.len()).with_peer(root);
        self.call(call, |c| c.broadcast(data, root))
    }
    fn all_to_all(&self, input: &[u8], output: &mut [u8]) -> Result<()> {
        let call = Call::new(FlightOp::AllToAll, None, input.len());
        self.call(call, |c| c.all_to_all(input, output))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::stub::Stub;

    fn recorded(capacity: usize, dir: Option<PathBuf>) -> Recorded {
        let options = Options::default()
            .flight_records(capacity)
            .flight_dir(dir.unwrap_or_else(|| PathBuf::from("/nonexistent/never/used")));
        Recorded::new(Arc::new(Stub::new(3, "fake")), &options)
    }

    /// The counter's times, scaled as a copy scales them, span at least what the monotonic
    /// clock saw between them and not much more: early in a group's life (`quanta`'s
    /// calibration) and later (the rate measured over the group's life).
    #[test]
    fn counter_times_agree_with_the_monotonic_clock() {
        let clock = Clock::new();
        let span = |sleep: Duration| {
            let first = clock.read();
            let t0 = Instant::now();
            std::thread::sleep(sleep);
            let t1 = Instant::now();
            let second = clock.read();
            let (scale, taken) = clock.scale();
            let (a, b) = (scale.ns(first), scale.ns(second));
            assert!(a <= b && b <= taken, "{a} <= {b} <= {taken}");
            (Duration::from_nanos(b - a), t1 - t0)
        };
        // First early (a copy taken before the group lived SELF_SCALED_AFTER, unless the
        // machine is slow), then later; a wrong scale (the counter's ticks taken for
        // nanoseconds) is off by far more than the slack over 100 ms.
        for sleep in [Duration::from_millis(2), Duration::from_millis(100)] {
            let (counted, seen) = span(sleep);
            assert!(
                counted + Duration::from_micros(50) >= seen,
                "{counted:?} against {seen:?}"
            );
            assert!(
                counted <= seen + Duration::from_millis(50),
                "{counted:?} against {seen:?}"
            );
        }
    }

    #[test]
    fn records_every_call_in_order_with_its_description() {
        let r = recorded(8, None);
        r.all_reduce(ReduceOp::Max, DType::F32, &mut [0; 16])
            .unwrap();
        r.send(&[0; 5], 2).unwrap();
        r.barrier().unwrap();
        let record = r.recorder().snapshot();
        assert_eq!((record.rank, record.size, record.backend), (0, 3, "fake"));
        assert_eq!((record.capacity, record.calls), (8, 3));
        let e = &record.entries;
        assert_eq!(e.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(e[0].op, FlightOp::AllReduce(ReduceOp::Max));
        assert_eq!(
            (e[0].dtype, e[0].bytes, e[0].count()),
            (Some(DType::F32), 16, Some(4))
        );
        assert_eq!(
            (e[1].op, e[1].peer, e[1].bytes),
            (FlightOp::Send, Some(2), 5)
        );
        assert_eq!(e[1].transport, Some(Transport::Unknown));
        assert_eq!(
            (e[0].algorithm, e[1].algorithm),
            (Some(Algorithm::OneShot), None)
        );
        assert_eq!(e[2].op, FlightOp::Barrier);
        for e in e {
            assert_eq!(e.outcome, FlightOutcome::Ok);
            assert!(e.end_ns.is_some_and(|end| end >= e.start_ns));
        }
        assert!(e[0].start_ns <= e[1].start_ns && e[1].start_ns <= e[2].start_ns);
    }

    #[test]
    fn a_groups_blocking_and_nonblocking_calls_are_recorded_with_their_element_type() {
        let g = crate::Group::with_options(Arc::new(Stub::new(3, "fake")), &Options::default());
        g.all_gather(&[1u16, 2], &mut [0; 6]).unwrap();
        let mut out = [0u16; 6];
        g.scope(|s| {
            s.start_all_gather(&[1u16, 2], &mut out)
                .and_then(|p| p.wait())
                .unwrap();
        });
        // The fake backend refuses broadcast (the trait's default): recorded as failed.
        g.broadcast(&mut [0i64; 3], 2).unwrap_err();
        let e = g.flight_record().entries;
        assert_eq!(e.len(), 3);
        assert!(e[..2].iter().all(|e| e.outcome == FlightOutcome::Ok));
        assert!(
            matches!(
                e[2].outcome,
                FlightOutcome::Failed {
                    kind: "Unsupported",
                    peer: None,
                    ..
                }
            ),
            "{:?}",
            e[2]
        );
        // The blocking and the nonblocking all_gather both record their element type.
        assert_eq!(
            (e[0].op, e[0].dtype, e[0].count()),
            (FlightOp::AllGather, Some(DType::U16), Some(2))
        );
        assert_eq!(
            (e[1].op, e[1].dtype, e[1].count()),
            (FlightOp::AllGather, Some(DType::U16), Some(2))
        );
        assert_eq!(
            (e[2].op, e[2].peer, e[2].count()),
            (FlightOp::Broadcast, Some(2), Some(3))
        );
    }

    #[test]
    fn keeps_the_last_calls_when_it_wraps_around() {
        let r = recorded(4, None);
        for len in 0..10 {
            r.all_gather(&vec![0; len], &mut []).unwrap();
        }
        let record = r.recorder().snapshot();
        assert_eq!(record.calls, 10);
        let kept: Vec<_> = record.entries.iter().map(|e| (e.seq, e.bytes)).collect();
        assert_eq!(kept, [(6, 6), (7, 7), (8, 8), (9, 9)]);
        // Exactly full, and one short of it.
        for (calls, first) in [(4, 0), (3, 0)] {
            let r = recorded(4, None);
            for _ in 0..calls {
                r.barrier().unwrap();
            }
            let seqs: Vec<u64> = r
                .recorder()
                .snapshot()
                .entries
                .iter()
                .map(|e| e.seq)
                .collect();
            assert_eq!(seqs, (first..calls).collect::<Vec<_>>());
        }
    }

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_record_is_no_larger_than_the_docs_say() {
        // `DEFAULT_FLIGHT_RECORDS` and `MAX_FLIGHT_RECORDS` give the memory from this.
        assert!(
            size_of::<FlightEntry>() <= 104,
            "{}",
            size_of::<FlightEntry>()
        );
    }

    #[test]
    fn a_call_shows_running_until_it_returns_and_a_later_one_in_its_slot_keeps_its_own_end() {
        let r = recorded(2, None);
        let call = Call::new(FlightOp::Barrier, None, 0);
        r.call(call, |_| {
            let e = r.recorder().snapshot().entries;
            assert_eq!(
                (e.len(), e[0].outcome, e[0].end_ns),
                (1, FlightOutcome::Running, None)
            );
            Ok(())
        })
        .unwrap();
        let e = r.recorder().snapshot().entries;
        assert_eq!(e[0].outcome, FlightOutcome::Ok);
        assert!(e[0].end_ns.is_some_and(|end| end >= e[0].start_ns));
        // A call whose slot was taken over before it returned leaves the new record as it is.
        let first = r.recorder().begin(call);
        r.barrier().unwrap();
        r.barrier().unwrap();
        r.recorder()
            .end(first, &Err(Error::invalid("a late failure")));
        let e = r.recorder().snapshot().entries;
        assert_eq!(e.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
        assert!(e.iter().all(|e| e.outcome == FlightOutcome::Ok), "{e:?}");
    }

    #[test]
    fn a_capacity_of_zero_records_nothing() {
        let r = recorded(0, None);
        r.barrier().unwrap();
        r.send(&[1], 1).unwrap();
        let record = r.recorder().snapshot();
        assert_eq!((record.capacity, record.calls), (0, 0));
        assert!(record.entries.is_empty());
    }

    #[test]
    fn a_failure_is_recorded_with_its_peer_and_dumped_once() {
        let dir = tempfile::tempdir().unwrap();
        let r = recorded(4, Some(dir.path().join("dumps")));
        r.barrier().unwrap();
        r.recv(&mut [0; 8], 1).unwrap_err();
        let record = r.recorder().snapshot();
        let failed = FlightOutcome::Failed {
            kind: "Timeout",
            fault: Fault::PeerFailed,
            peer: Some(1),
        };
        assert_eq!(record.entries[1].outcome, failed);
        let path = dir.path().join("dumps/flight-rank0.json");
        let dumped: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(dumped["entries"][1]["op"], "recv");
        assert_eq!(dumped["entries"][1]["error"]["peer"], 1);
        assert!(dir.path().join("dumps/flight-rank0.trace.json").exists());
        // A second failure does not write again.
        std::fs::remove_file(&path).unwrap();
        r.recv(&mut [0; 8], 2).unwrap_err();
        assert!(!path.exists());
    }

    #[test]
    fn a_dump_that_cannot_be_written_leaves_the_error_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let r = recorded(4, Some(file.join("under-a-file")));
        let err = r.recv(&mut [0; 8], 1).unwrap_err();
        assert!(matches!(err, Error::Timeout { peer: 1, .. }), "{err}");
    }

    #[test]
    fn a_live_group_that_opted_in_is_written_on_request_and_a_dropped_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let options = |sub: &str| {
            Options::default()
                .flight_records(4)
                .flight_dir(dir.path().join(sub))
                .flight_signal(true)
        };
        let kept = Recorded::new(Arc::new(Stub::new(3, "fake")), &options("kept"));
        kept.barrier().unwrap();
        kept.all_reduce(ReduceOp::Sum, DType::F32, &mut [0; 8])
            .unwrap();
        drop(Recorded::new(
            Arc::new(Stub::new(3, "fake")),
            &options("dropped"),
        ));
        let silent = Recorded::new(
            Arc::new(Stub::new(3, "fake")),
            &Options::default()
                .flight_records(4)
                .flight_dir(dir.path().join("silent")),
        );
        silent.barrier().unwrap();
        // Other tests of this process may have live groups that opted in: only this
        // test's directories are looked at.
        let lines = signal::dump_live();
        let json = dir.path().join("kept/flight-rank0.json");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("rank 0 of 3 (fake, 2 calls)")
                    && l.ends_with(&format!("flight record in {}", json.display()))),
            "{lines:?}"
        );
        let dumped: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(dumped["entries"][1]["op"], "all_sum");
        assert_eq!(dumped["entries"][1]["algorithm"], "one_shot");
        assert!(!dir.path().join("dropped").exists());
        assert!(!dir.path().join("silent").exists());
    }

    #[test]
    fn a_group_that_names_no_directory_writes_into_one_of_the_process() {
        if crate::config::env::flight_dir(&crate::config::env::process).is_some() {
            return; // the environment names one for every group
        }
        let options = Options::default().flight_records(2).flight_signal(true);
        let r = Recorded::new(
            // A rank no other test's group has, so that its file is this test's alone.
            Arc::new(Stub::new(8, "fake").at_rank(7)),
            &options,
        );
        r.barrier().unwrap();
        let dir = std::env::temp_dir().join(format!("nuvec-flight-{}", std::process::id()));
        let json = dir.join("flight-rank7.json");
        let lines = signal::dump_live();
        assert!(
            lines.iter().any(|l| l
                == &format!(
                    "rank 7 of 8 (fake, 1 call): flight record in {}",
                    json.display()
                )),
            "{lines:?}"
        );
        let dumped: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(dumped["entries"][0]["op"], "barrier");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_trace_has_one_complete_event_per_call_on_the_rank() {
        let r = recorded(4, None);
        r.barrier().unwrap();
        r.all_reduce(ReduceOp::Sum, DType::I32, &mut [0; 8])
            .unwrap();
        let trace: Value =
            serde_json::from_str(&r.recorder().snapshot().to_chrome_trace()).unwrap();
        let events = trace["traceEvents"].as_array().unwrap();
        let calls: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (&calls[1]["name"], &calls[1]["pid"]),
            (&"all_sum".into(), &0.into())
        );
        assert_eq!(calls[1]["args"]["count"], 2);
        assert_eq!(calls[1]["args"]["algorithm"], "one_shot");
        assert_eq!(calls[0]["args"]["algorithm"], Value::Null);
    }
}
