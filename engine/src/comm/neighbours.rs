//! Who is next to whom in a ring: the TCP ring's and JACCL's ring mode alike, where a rank
//! talks only to the ranks beside it.

use crate::error::{Error, Result};

/// Rank `rank`'s place in a ring of `size` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Neighbours {
    rank: usize,
    size: usize,
}

impl Neighbours {
    /// Rank `rank` of `size` (`rank < size`).
    pub(crate) fn new(rank: usize, size: usize) -> Neighbours {
        debug_assert!(rank < size, "rank {rank} of {size}");
        Neighbours { rank, size }
    }

    /// The rank before this one (the last rank's, for rank 0).
    pub(crate) fn left(self) -> usize {
        (self.rank + self.size - 1) % self.size
    }

    /// The rank after this one (rank 0, for the last rank).
    pub(crate) fn right(self) -> usize {
        (self.rank + 1) % self.size
    }

    /// Whether `peer` is the left or the right neighbour.
    #[cfg_attr(
        not(feature = "jaccl"),
        allow(
            dead_code,
            reason = "the TCP ring picks its connection per neighbour instead"
        )
    )]
    pub(crate) fn is_neighbour(self, peer: usize) -> bool {
        peer != self.rank && (peer == self.left() || peer == self.right())
    }

    /// `Ok` if `peer` is a neighbour; else [`Neighbours::refusal`].
    #[cfg_attr(
        not(feature = "jaccl"),
        allow(
            dead_code,
            reason = "the TCP ring picks its connection per neighbour instead"
        )
    )]
    pub(crate) fn check(self, what: &str, peer: usize, who: &str, why: &str) -> Result<()> {
        if self.is_neighbour(peer) {
            Ok(())
        } else {
            Err(self.refusal(what, peer, who, why))
        }
    }

    /// The argument error that this rank cannot `what` (`"send to"`, `"receive from"`)
    /// `peer`, saying that `who` (`"the ring backend"`) connects only neighbours, followed by
    /// `why` (for example, what to use instead).
    pub(crate) fn refusal(self, what: &str, peer: usize, who: &str, why: &str) -> Error {
        let (left, right) = (self.left(), self.right());
        let neighbours = if left == right {
            format!("rank {left}")
        } else {
            format!("ranks {left} and {right}")
        };
        Error::invalid(format!(
            "rank {} cannot {what} rank {peer}: {who} connects only neighbours ({neighbours}){why}",
            self.rank
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_and_right_wrap_around() {
        // (size, rank, left, right)
        let cases = [
            (1, 0, 0, 0),
            (2, 0, 1, 1),
            (2, 1, 0, 0),
            (3, 0, 2, 1),
            (3, 1, 0, 2),
            (3, 2, 1, 0),
            (4, 0, 3, 1),
            (4, 3, 2, 0),
            (5, 0, 4, 1),
            (5, 2, 1, 3),
            (5, 4, 3, 0),
        ];
        for (size, rank, left, right) in cases {
            let n = Neighbours::new(rank, size);
            assert_eq!(
                (n.left(), n.right()),
                (left, right),
                "rank {rank} of {size}"
            );
        }
    }

    #[test]
    fn only_the_ranks_beside_are_neighbours() {
        for size in 1..=5 {
            for rank in 0..size {
                let n = Neighbours::new(rank, size);
                for peer in 0..size + 1 {
                    let beside = peer < size
                        && peer != rank
                        && ((peer + 1) % size == rank || (rank + 1) % size == peer);
                    assert_eq!(
                        n.is_neighbour(peer),
                        beside,
                        "{peer} beside {rank} of {size}"
                    );
                    assert_eq!(n.check("send to", peer, "x", "").is_ok(), beside);
                }
            }
        }
    }

    #[test]
    fn the_refusal_names_the_rank_the_peer_and_the_neighbours() {
        let e = Neighbours::new(0, 5)
            .check("send to", 2, "the ring backend", ", as MLX's ring does")
            .unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && !e.is_fatal(),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            Error::invalid(
                "rank 0 cannot send to rank 2: the ring backend connects only neighbours \
                 (ranks 4 and 1), as MLX's ring does"
            )
            .to_string()
        );
        // A rank is not its own neighbour, even in a ring of one.
        let e = Neighbours::new(0, 1)
            .check("receive from", 0, "the ring backend", "")
            .unwrap_err();
        assert!(e.to_string().contains("(rank 0)"), "{e}");
    }
}
