//! How a group is formed: the timeout every wait is bounded by, and (with the
//! authentication work) a pre-shared key.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, Result};

/// The variable [`init`](crate::init) reads the timeout from, in seconds.
pub const TIMEOUT_VAR: &str = "NUVEC_DISTRIBUTED_TIMEOUT";

/// Options of [`init_with`](crate::init_with).
#[derive(Clone)]
#[non_exhaustive]
pub struct Options {
    /// How long connecting, and every transfer, may wait for a peer that makes no progress
    /// before failing with an error naming it. Default 30 s ([`TIMEOUT_VAR`], in seconds, for
    /// [`init`](crate::init)).
    pub timeout: Duration,
    /// A pre-shared key for authenticating connections; set by the authentication handshake,
    /// which is not part of this build yet, so it is always `None`.
    #[allow(dead_code)]
    pub(crate) key: Option<Vec<u8>>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            key: None,
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("timeout", &self.timeout)
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Options {
    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Options from the environment: [`TIMEOUT_VAR`].
    pub(crate) fn from_env() -> Result<Self> {
        let mut options = Options::default();
        if let Some(text) = std::env::var_os(TIMEOUT_VAR) {
            options.timeout = parse_timeout(&text.to_string_lossy())?;
        }
        Ok(options)
    }

    /// Checks values a caller may have set by hand.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.timeout.is_zero() {
            return Err(Error::invalid("Options::timeout must be more than zero"));
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
