//! The engine's errors as nuvec-core's [`Error`](nuvec_core::Error).
//!
//! nuvec-core's error enum has no variant for a network, so each engine error goes to the
//! variant whose meaning and printed prefix fit it, by whose fault it is
//! ([`engine::Fault`]):
//!
//! | engine fault | nuvec-core variant | printed as |
//! |---|---|---|
//! | a peer failed, misbehaved or is incompatible; a local failure; failed earlier; closed | [`Error::Io`](nuvec_core::Error::Io) | `I/O error: distributed all_sum: rank 1: ...` |
//! | misuse (a mismatched call on the native wire included), configuration, unavailable | [`Error::InvalidArgument`](nuvec_core::Error::InvalidArgument) | `invalid argument: distributed all_sum: ...` |
//!
//! `Io` because a peer's failure reaches this rank as a failed read or write of a socket
//! (or an RDMA queue), which is what nuvec's `Io` means; not `Backend`, which nuvec prints as
//! "GPU backend error". The text is the engine's message whole (the peer's rank and address,
//! what this rank was doing and in which collective or setup phase), after the nuvec call
//! that failed, so a user reading one line knows whom to look at.

use std::fmt;

use nuvec_core::distributed::AllReduce;

/// The nuvec call an engine error happened in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    /// Forming a group: `init`, `init_backend`, `init_with`.
    Init,
    Reduce(AllReduce),
    Gather,
    Send(usize),
    Recv(usize),
    Split,
    /// Replacing the default group by the survivors' ([`crate::shrink`]).
    Shrink,
    /// Forming the full group again ([`crate::rejoin`]).
    Rejoin,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Call::Init => f.write_str("init"),
            Call::Reduce(AllReduce::Sum) => f.write_str("all_sum"),
            Call::Reduce(AllReduce::Max) => f.write_str("all_max"),
            Call::Reduce(AllReduce::Min) => f.write_str("all_min"),
            Call::Reduce(op) => write!(f, "all_reduce ({op:?})"),
            Call::Gather => f.write_str("all_gather"),
            Call::Send(dst) => write!(f, "send to rank {dst}"),
            Call::Recv(src) => write!(f, "recv from rank {src}"),
            Call::Split => f.write_str("split"),
            Call::Shrink => f.write_str("shrink"),
            Call::Rejoin => f.write_str("rejoin"),
        }
    }
}

impl Call {
    /// `error` as nuvec's error (see the module docs for the variant).
    pub(crate) fn error(self, error: engine::Error) -> nuvec_core::Error {
        // nuvec prints its own "invalid argument: " before the text; the engine's argument
        // errors carry the same words, so only the message goes in.
        let text = match &error {
            engine::Error::InvalidArgument(msg) => format!("distributed {self}: {msg}"),
            other => format!("distributed {self}: {other}"),
        };
        match error.fault() {
            engine::Fault::Misuse | engine::Fault::Config | engine::Fault::Unavailable => {
                nuvec_core::Error::InvalidArgument(text)
            }
            _ => nuvec_core::Error::Io(text),
        }
    }
}

/// A call this crate cannot serve (a dtype or reduction the engine lacks).
pub(crate) fn unsupported(call: Call, what: String) -> nuvec_core::Error {
    nuvec_core::Error::InvalidArgument(format!("distributed {call}: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_failures_are_io_and_keep_the_engine_text() {
        let e = engine::Error::Lost {
            peer: 2,
            via: 1,
            context: engine::Phase::AllSum,
        };
        let engine_text = e.to_string();
        let got = Call::Reduce(AllReduce::Sum).error(e);
        assert!(matches!(got, nuvec_core::Error::Io(_)), "{got:?}");
        assert_eq!(
            got.to_string(),
            format!("I/O error: distributed all_sum: {engine_text}")
        );
        assert!(got.to_string().contains("rank 2"), "{got}");
    }

    #[test]
    fn misuse_and_configuration_are_invalid_arguments() {
        let e = engine::Error::InvalidArgument("all_gather: the output holds 3 elements".into());
        let got = Call::Gather.error(e);
        assert!(
            matches!(got, nuvec_core::Error::InvalidArgument(_)),
            "{got:?}"
        );
        assert!(
            got.to_string()
                == "invalid argument: distributed all_gather: all_gather: the output holds 3 elements",
            "{got}"
        );
        let e = engine::Error::Environment {
            var: "MLX_RANK",
            reason: "not a number".into(),
        };
        let got = Call::Init.error(e);
        assert!(
            matches!(got, nuvec_core::Error::InvalidArgument(_)),
            "{got:?}"
        );
        assert!(got.to_string().contains("MLX_RANK"), "{got}");
    }

    #[test]
    fn calls_name_their_peer() {
        assert_eq!(Call::Send(3).to_string(), "send to rank 3");
        assert_eq!(Call::Recv(0).to_string(), "recv from rank 0");
        assert_eq!(Call::Reduce(AllReduce::Min).to_string(), "all_min");
    }
}
