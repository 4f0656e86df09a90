//! How a group is formed: the timeout every wait is bounded by, and (with the
//! authentication work) a pre-shared key.

use std::fmt;
use std::time::Duration;

use crate::auth::{KEY_VAR, Secret};
use crate::error::{Error, Result};

/// The variable [`init`](crate::init) reads the timeout from, in seconds.
pub const TIMEOUT_VAR: &str = "NUVEC_DISTRIBUTED_TIMEOUT";

/// The variable [`init`](crate::init) reads [`Options::tcp_congestion`] from.
pub const TCP_CONGESTION_VAR: &str = "NUVEC_DISTRIBUTED_TCP_CONGESTION";

/// The variable [`init`](crate::init) reads [`Options::socket_buffer`] from, in bytes.
pub const SOCKET_BUFFER_VAR: &str = "NUVEC_DISTRIBUTED_SOCKET_BUFFER";

/// The variable [`init`](crate::init) reads [`Options::spin`] from, in microseconds.
pub const SPIN_VAR: &str = "NUVEC_DISTRIBUTED_SPIN_US";

/// Options of [`init_with`](crate::init_with).
#[derive(Clone)]
#[non_exhaustive]
pub struct Options {
    /// How long connecting, and every transfer, may wait for a peer that makes no progress
    /// before failing with an error naming it. Default 30 s ([`TIMEOUT_VAR`], in seconds, for
    /// [`init`](crate::init)).
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
    /// collective at slightly different times. An idle group never spins.
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

    /// Options from the environment: [`TIMEOUT_VAR`], [`TCP_CONGESTION_VAR`],
    /// [`SOCKET_BUFFER_VAR`], [`SPIN_VAR`], [`KEY_VAR`].
    pub(crate) fn from_env() -> Result<Self> {
        let mut options = Options::default();
        if let Some(secret) = std::env::var_os(KEY_VAR).filter(|s| !s.is_empty()) {
            options.key = Some(Secret::new(secret.as_encoded_bytes()));
            if let Some(Err(e)) = options.key.as_ref().map(Secret::key) {
                return Err(Error::Environment {
                    var: KEY_VAR,
                    reason: e.to_string(),
                });
            }
        }
        if let Some(text) = std::env::var_os(TIMEOUT_VAR) {
            options.timeout = parse_timeout(&text.to_string_lossy())?;
        }
        if let Some(text) = std::env::var_os(TCP_CONGESTION_VAR) {
            let name = text.to_string_lossy().trim().to_string();
            if !name.is_empty() {
                options.tcp_congestion = Some(name);
            }
        }
        if let Some(text) = std::env::var_os(SPIN_VAR).filter(|t| !t.is_empty()) {
            let text = text.to_string_lossy();
            let micros = text.trim().parse::<u64>().map_err(|_| Error::Environment {
                var: SPIN_VAR,
                reason: format!("{text:?} is not a whole number of microseconds"),
            })?;
            options.spin = Duration::from_micros(micros);
        }
        if let Some(text) = std::env::var_os(SOCKET_BUFFER_VAR).filter(|t| !t.is_empty()) {
            let text = text.to_string_lossy();
            let bytes = text
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|&b| b > 0)
                .ok_or_else(|| Error::Environment {
                    var: SOCKET_BUFFER_VAR,
                    reason: format!("{text:?} is not a positive number of bytes"),
                })?;
            options.socket_buffer = Some(bytes);
        }
        Ok(options)
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

fn parse_timeout(text: &str) -> Result<Duration> {
    let bad = |why: &str| Error::Environment {
        var: TIMEOUT_VAR,
        reason: format!("{text:?} {why}"),
    };
    let seconds: f64 = text
        .trim()
        .parse()
        .map_err(|_| bad("is not a number of seconds"))?;
    if seconds.is_nan() || seconds <= 0.0 {
        return Err(bad("must be more than zero seconds"));
    }
    Duration::try_from_secs_f64(seconds).map_err(|_| bad("is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_parse_as_seconds() {
        assert_eq!(parse_timeout("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_timeout(" 30 ").unwrap(), Duration::from_secs(30));
        for bad in ["", "abc", "0", "-1", "NaN", "1e300"] {
            let e = parse_timeout(bad).unwrap_err().to_string();
            assert!(e.contains(TIMEOUT_VAR), "{e}");
        }
    }
}
