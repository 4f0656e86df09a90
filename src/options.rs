//! How a group is formed: the timeout every wait is bounded by, and (with the
//! authentication work) a pre-shared key.

use std::fmt;
use std::time::{Duration, Instant};

use crate::auth::Secret;
use crate::error::{Error, Result};
// The environment's names for these options; `config::env` reads them.
pub use crate::config::env::{SOCKET_BUFFER_VAR, SPIN_VAR, TCP_CONGESTION_VAR, TIMEOUT_VAR};

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
#[derive(Clone)]
#[non_exhaustive]
pub struct Options {
    /// How long connecting, and every transfer, may wait for a peer that makes no progress
    /// before failing with an error naming it. Default 30 s ([`TIMEOUT_VAR`], in seconds, for
    /// [`init`](crate::init)). The kernel's own timeouts on each connection (keepalive, and
    /// `TCP_USER_TIMEOUT` on Linux) are derived from it, so a peer that is late by less than
    /// this never fails a collective, whatever its size. Any value above zero is accepted;
    /// one beyond what the clock can represent (up to [`Duration::MAX`]) waits as good as
    /// forever.
    pub timeout: Duration,
    /// The TCP congestion control every connection uses (Linux: `TCP_CONGESTION`), or
    /// `None` (the default) for the system's. On loopback the common default, `bbr`, paces
    /// each stream well below what the machine can move; `"cubic"` or `"reno"` lift large
    /// collectives by about a third on the 2-vCPU VMs this was measured on (see the
    /// README's benchmark notes). Only algorithms in
    /// `/proc/sys/net/ipv4/tcp_allowed_congestion_control` may be chosen without
    /// privileges.
    pub tcp_congestion: Option<String>,
    /// Send and receive buffer size of every connection, in bytes, or `None` (the default)
    /// for the kernel's autotuning, which measured as fast or faster on loopback. Setting
    /// it turns autotuning off for those sockets.
    pub socket_buffer: Option<usize>,
    /// How long a collective that is waiting for a peer keeps retrying before it sleeps in
    /// the kernel. Default 50 µs: waking a thread that slept costs ~100 µs on the VMs this
    /// was measured on, against a ~10 µs round trip. Retries yield the CPU after the first
    /// 10 µs, and from the start when the hostfile puts more ranks on this host than it has
    /// CPUs. Zero never spins (lowest CPU use); longer suits ranks that often arrive at a
    /// collective at slightly different times. An idle group never spins, and spinning
    /// counts against [`Options::timeout`]: it ends at the deadline however long it is set.
    pub spin: Duration,
    /// The pre-shared secret every connection authenticates with (see [`Options::key`]).
    pub(crate) key: Option<Secret>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            tcp_congestion: None,
            socket_buffer: None,
            spin: Duration::from_micros(50),
            key: None,
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("timeout", &self.timeout)
            .field("tcp_congestion", &self.tcp_congestion)
            .field("socket_buffer", &self.socket_buffer)
            .field("spin", &self.spin)
            .field("key", &self.key)
            .finish()
    }
}

impl Options {
    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Authenticates every connection with this pre-shared secret, which must be the same
    /// on every rank and at least 16 bytes long (`NUVEC_DISTRIBUTED_KEY` for
    /// [`init`](crate::init)).
    ///
    /// Each connection then runs a mutual challenge-response before any data flows (see
    /// the crate docs): a host without the key can neither join the ring nor keep a rank
    /// out of it. MLX's ranks do not speak this handshake, so a keyed ring is made of nuvec
    /// ranks only. The traffic after the handshake is **not encrypted** or authenticated;
    /// on an untrusted network, run the ring over a VPN.
    pub fn key(mut self, secret: impl AsRef<[u8]>) -> Self {
        self.key = Some(Secret::new(secret.as_ref()));
        self
    }

    /// Sets the TCP congestion control of every connection (see
    /// [`Options::tcp_congestion`]).
    pub fn tcp_congestion(mut self, algorithm: impl Into<String>) -> Self {
        self.tcp_congestion = Some(algorithm.into());
        self
    }

    /// Sets the send and receive buffer size of every connection (see
    /// [`Options::socket_buffer`]).
    pub fn socket_buffer(mut self, bytes: usize) -> Self {
        self.socket_buffer = Some(bytes);
        self
    }

    /// Sets how long a waiting collective retries before it sleeps (see [`Options::spin`]).
    pub fn spin(mut self, spin: Duration) -> Self {
        self.spin = spin;
        self
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
        Ok(())
    }
}
