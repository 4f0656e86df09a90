//! USDT probes: DTrace probes on macOS and SystemTap SDT notes on Linux (for bpftrace and
//! perf), behind the `probes` feature. Without the feature every function here is empty and
//! inlined away; with it, a probe that no tracer enabled costs a load and a branch (the
//! probe's semaphore) and its arguments are not even computed.
//!
//! The provider is `nuvec`. Probe names use single underscores, because perf rejects the
//! dashes DTrace would make of double ones. Arguments are integers:
//!
//! | probe | arguments |
//! |---|---|
//! | `collective_start` | op, dtype, bytes, ranks |
//! | `collective_done` | op, dtype, bytes, ranks, duration in ns, 1 if it succeeded |
//! | `send_step` | peer rank, step, bytes |
//! | `recv_step` | peer rank, step, bytes |
//! | `connect_done` | rank, ranks, connections per neighbour, duration in ns, 1 if it formed |
//! | `error` | peer rank (or `u64::MAX`), error kind |
//!
//! Both backends (the TCP ring and JACCL) fire the same probes with the same codes; only
//! the ring has `send_step` and `recv_step`. `connect_done`'s connections are per neighbour
//! on a ring and 1 for a JACCL mesh (one queue pair per peer).
//!
//! Op codes: 0 all_sum, 1 all_max, 2 all_min, 3 all_gather, 4 sum_scatter, 5 send,
//! 6 recv, 7 barrier (an all_sum of one element underneath, traced as the barrier),
//! 8 broadcast, 9 all_to_all (one start and one done per call, though on the MLX wire
//! they run as several steps, each of which fires `send_step`/`recv_step`). Dtype
//! codes follow MLX's order (0 bool ... 13 complex64); 255 for byte-level collectives.
//! Error kinds: 1 I/O, 2 closed, 3 lost (a peer's notice), 4 timeout, 5 authentication,
//! 6 protocol violation, 7 incompatible peer, 8 local or a bug, 9 RDMA, 10 mismatched calls (native wire), 0 other. The macros live here, not in nuvec-distributed, because they
//! expand to inline assembly, which is `unsafe` and so belongs in this crate.

#[cfg(feature = "probes")]
#[usdt::provider(provider = "nuvec")]
mod nuvec {
    fn collective_start(op: u8, dtype: u8, bytes: u64, ranks: u64) {}
    fn collective_done(op: u8, dtype: u8, bytes: u64, ranks: u64, duration_ns: u64, ok: u8) {}
    fn send_step(peer: u64, step: u64, bytes: u64) {}
    fn recv_step(peer: u64, step: u64, bytes: u64) {}
    fn connect_done(rank: u64, ranks: u64, connections: u64, duration_ns: u64, ok: u8) {}
    fn error(peer: u64, kind: u8) {}
}

/// Whether this build has probes at all (the `probes` feature).
pub const ENABLED: bool = cfg!(feature = "probes");

/// Registers the probes with the system's DTrace (needed on macOS; a no-op with SDT notes
/// on Linux). Called once when a group forms.
pub fn register() {
    #[cfg(feature = "probes")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let _ = usdt::register_probes();
        });
    }
}

/// Defines a probe's function: with the feature it fires the probe with the arguments given
/// after `=>`, without it it only takes its arguments (and is inlined away).
macro_rules! probe {
    ($(#[$doc:meta])* $name:ident($($arg:ident: $ty:ty),*) => ($($fired:expr),*)) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name($($arg: $ty),*) {
            #[cfg(feature = "probes")]
            nuvec::$name!(|| ($($fired),*));
            #[cfg(not(feature = "probes"))]
            let _ = ($($arg),*);
        }
    };
}

probe! {
    /// A collective begins.
    collective_start(op: u8, dtype: u8, bytes: u64, ranks: u64) => (op, dtype, bytes, ranks)
}

probe! {
    /// A collective ends.
    collective_done(op: u8, dtype: u8, bytes: u64, ranks: u64, duration_ns: u64, ok: bool)
        => (op, dtype, bytes, ranks, duration_ns, u8::from(ok))
}

/// Runs `collective` between [`collective_start`] and [`collective_done`], timing it only in
/// builds with probes (without them this is free).
#[inline(always)]
pub fn collective<E>(
    op: u8,
    dtype: u8,
    bytes: u64,
    ranks: u64,
    collective: impl FnOnce() -> Result<(), E>,
) -> Result<(), E> {
    let start = ENABLED.then(std::time::Instant::now);
    collective_start(op, dtype, bytes, ranks);
    let result = collective();
    let elapsed = start.map_or(0, |s| s.elapsed().as_nanos() as u64);
    collective_done(op, dtype, bytes, ranks, elapsed, result.is_ok());
    result
}

probe! {
    /// A ring step's send to `peer` finished.
    send_step(peer: u64, step: u64, bytes: u64) => (peer, step, bytes)
}

probe! {
    /// A ring step's receive from `peer` finished.
    recv_step(peer: u64, step: u64, bytes: u64) => (peer, step, bytes)
}

probe! {
    /// Forming a group ended.
    connect_done(rank: u64, ranks: u64, connections: u64, duration_ns: u64, ok: bool)
        => (rank, ranks, connections, duration_ns, u8::from(ok))
}

probe! {
    /// A group failed.
    error(peer: u64, kind: u8) => (peer, kind)
}
