//! [`Group::split`]: sub-groups that form connections of their own.
//!
//! A split is a collective on the parent: every rank gathers one fixed-size record from
//! every other (its color, its key, and the fresh ports it listens on), then the members of
//! each color form a group of their own with the formation code that formed the parent
//! ([`form_ring`]), on the parent's wire and with its [`Options`](crate::Options) (timeout, key, spin,
//! socket tuning). From then on the sub-group shares nothing with the parent or its
//! siblings but the process: closing or failing one leaves the others as they are.
//!
//! Each member listens on a port the kernel picks (port 0) on the IP address it already
//! uses in the parent, one per parent connection. The listener is bound before the
//! exchange and handed to formation as it is ([`tcp::reserve`]), so no other process can
//! take the port in between.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use crate::backend::form_ring;
use crate::config::hostfile;
use crate::error::{Error, Phase, Result};
use crate::group::{Group, Origin};
use crate::transport::tcp::socket::{self as tcp, SocketTuning};
use crate::verbose::verbose;

impl Group {
    /// The color of a rank that takes part in no sub-group of [`Group::split`] (any
    /// negative color does the same).
    pub const NO_COLOR: i32 = -1;

    /// Splits the group into sub-groups, as MLX's `Group.split(color, key=-1)`: the ranks
    /// that pass the same `color` form one group, ranked by `key` (the smallest key is rank
    /// 0), ties and negative keys going by rank in this group (a negative key is this
    /// rank). Pass `-1` as `key` to keep this group's order.
    ///
    /// A collective on this group: every rank must call it, in the same place among its
    /// collectives. Each sub-group forms connections of its own: the ranks gather each
    /// other's records over this group (color, key and one fresh port per connection, on
    /// the IP address each rank already uses here), then form on this group's wire with
    /// the [`Options`](crate::Options) it was formed with (timeout, key, spin, socket
    /// tuning). A sub-group lives on its own: closing or failing it leaves this group and
    /// its other sub-groups as they are, and the other way round. Its errors name peers by
    /// their rank in the sub-group.
    ///
    /// A rank whose `color` is negative ([`Group::NO_COLOR`]) takes part in no sub-group;
    /// it still has to make the call, and gets the group of itself alone
    /// ([`Group::single`]). MLX has no convention for it (its ring and JACCL refuse to
    /// split); this follows MPI's `MPI_UNDEFINED` and NCCL's `NCCL_SPLIT_NOCOLOR`, which are
    /// negative too, except that those hand back no group at all. A color that only this
    /// rank chose also gives the group of itself alone. A group of one splits to itself.
    ///
    /// MLX's ranks cannot take part: their ring refuses `split`.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for a JACCL group (JACCL sets its queue pairs up once, for the
    /// one group it forms) or a group over another [`Communicator`](crate::Communicator). A failure of the
    /// exchange over this group is that collective's error, and this group is failed;
    /// a failure to form the sub-group is a formation error naming the sub-group's rank,
    /// and leaves this group usable.
    ///
    /// # Examples
    ///
    /// ```
    /// # nuvec_tools::testing::two_ranks(|group| {
    /// // On each rank of a group of two (formed as in `init_with`'s example):
    /// // One color, keys in reverse: the sub-group has both ranks, numbered the other way.
    /// let sub = group.split(0, (group.size() - group.rank()) as i32)?;
    /// assert_eq!((sub.size(), sub.rank()), (2, 1 - group.rank()));
    /// let mut all = [0u8; 2];
    /// sub.all_gather(&[group.rank() as u8], &mut all)?;
    /// assert_eq!(all, [1, 0]); // sub-group rank 0 is rank 1 here
    ///
    /// // A color each: two groups of one.
    /// let alone = group.split(group.rank() as i32, -1)?;
    /// assert_eq!(alone.size(), 1);
    /// sub.close()?; // closes the sub-group only
    /// group.barrier()?;
    /// # Ok(()) });
    /// ```
    pub fn split(&self, color: i32, key: i32) -> Result<Group> {
        split(self, self.origin(), color, key)
    }
}

/// Bytes of a record before its addresses: the color (i32) and the key (i64, a negative key
/// already replaced by the parent rank).
const HEAD: usize = 4 + 8;
/// Bytes per address: an IPv4 address and a port, both big-endian.
const ADDRESS: usize = 4 + 2;

/// One rank's part of a split, as gathered from every rank.
#[derive(Debug, PartialEq, Eq)]
struct Record {
    color: i32,
    key: i64,
    ports: Vec<SocketAddr>,
}

fn encode(color: i32, key: i64, ports: &[SocketAddr], connections: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEAD + ADDRESS * connections);
    out.extend_from_slice(&color.to_le_bytes());
    out.extend_from_slice(&key.to_le_bytes());
    for i in 0..connections {
        // A rank in no sub-group listens nowhere: its addresses are zeros.
        let (ip, port) = match ports.get(i) {
            Some(SocketAddr::V4(v4)) => (*v4.ip(), v4.port()),
            _ => (Ipv4Addr::UNSPECIFIED, 0),
        };
        out.extend_from_slice(&ip.octets());
        out.extend_from_slice(&port.to_be_bytes());
    }
    out
}

fn decode(bytes: &[u8]) -> Option<Record> {
    let color = i32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?);
    let key = i64::from_le_bytes(bytes.get(4..HEAD)?.try_into().ok()?);
    let ports = bytes
        .get(HEAD..)?
        .as_chunks::<ADDRESS>()
        .0
        .iter()
        .map(|a| {
            let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
            SocketAddr::new(IpAddr::V4(ip), u16::from_be_bytes([a[4], a[5]]))
        })
        .collect();
    Some(Record { color, key, ports })
}

/// The parent ranks of `color`'s sub-group, in their new rank order: by key, then by
/// parent rank (MLX's and MPI's order).
fn members(records: &[Record], color: i32) -> Vec<usize> {
    let mut ranks: Vec<usize> = (0..records.len())
        .filter(|&r| records[r].color == color)
        .collect();
    ranks.sort_by_key(|&r| (records[r].key, r));
    ranks
}

/// Listeners reserved for the sub-group; whatever formation did not take is closed on drop.
struct Reserved(Vec<SocketAddr>);

impl Drop for Reserved {
    fn drop(&mut self) {
        for &addr in &self.0 {
            tcp::release(addr);
        }
    }
}

/// [`Group::split`] of `parent`, which was formed as `origin` says (`None`: not by this
/// crate's ring formation).
pub(crate) fn split(
    parent: &Group,
    origin: Option<&Origin>,
    color: i32,
    key: i32,
) -> Result<Group> {
    if parent.size() == 1 {
        return Ok(parent.clone());
    }
    let Some(origin) = origin else {
        return Err(Error::Unsupported(match parent.backend() {
            "jaccl" => "split: a JACCL group cannot be split. JACCL sets up its queue pairs \
                        once, through its coordinator, for the one group it forms; a \
                        sub-group would need queue pairs of its own on the same Thunderbolt \
                        devices, which allow only about ten each, and on a JACCL ring the \
                        members of a sub-group are in general not cabled to each other. \
                        MLX's jaccl refuses split as well. Split a ring group (over the \
                        same hosts) instead."
                .to_string(),
            backend => format!(
                "split: this {backend} group was not formed by init or init_with, so it has \
                 no addresses to form a sub-group on"
            ),
        }));
    };
    let (rank, connections) = (parent.rank(), origin.listen.len());
    let member = color >= 0;
    let key = if key < 0 { rank as i64 } else { i64::from(key) };

    let mut reserved = Reserved(Vec::new());
    if member {
        let tuning = SocketTuning::from_options(&origin.options);
        for (i, addr) in origin.listen.iter().enumerate() {
            let ip = addr.ip();
            if !ip.is_ipv4() || ip.is_unspecified() {
                return Err(Error::invalid(format!(
                    "split: rank {rank} listens on {addr} (its address {i}) in the parent \
                     group, which its peers cannot dial on a fresh port"
                )));
            }
            let fresh = tcp::reserve(ip, &tuning).map_err(|e| {
                Error::local(
                    format!("split: rank {rank} cannot listen on a fresh port of {ip}"),
                    e,
                )
            })?;
            reserved.0.push(fresh);
        }
    }

    let mine = encode(
        if member { color } else { -1 },
        key,
        &reserved.0,
        connections,
    );
    let mut gathered = vec![0u8; mine.len() * parent.size()];
    parent.all_gather(&mine, &mut gathered)?;
    // all_gather gathers equal blocks, each as long as this rank's, so every one decodes.
    let records = gathered
        .chunks_exact(mine.len())
        .map(decode)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::Bug {
            context: Phase::AllGather,
            what: format!(
                "split: a gathered record is shorter than {} bytes",
                mine.len()
            ),
        })?;

    if !member {
        return Ok(Group::single());
    }
    let order = members(&records, color);
    let Some(new_rank) = order.iter().position(|&r| r == rank) else {
        return Err(Error::Bug {
            context: Phase::AllGather,
            what: format!("split: rank {rank} is missing from its own color {color}"),
        });
    };
    if order.len() == 1 {
        return Ok(Group::single());
    }
    let mut nodes = Vec::with_capacity(order.len());
    for &r in &order {
        let ports = &records[r].ports;
        if let Some(bad) = ports
            .iter()
            .find(|a| a.port() == 0 || a.ip().is_unspecified())
        {
            return Err(Error::PeerMisbehaved {
                peer: r,
                addr: None,
                context: Phase::AllGather,
                reason: format!(
                    "split: rank {r} chose color {color} but sent no address to listen on \
                     ({bad})"
                ),
            });
        }
        nodes.push(ports.iter().map(SocketAddr::to_string).collect::<Vec<_>>());
    }
    let place = PathBuf::from(format!(
        "<split(color={color}) of ranks {order:?} of the parent group>"
    ));
    let addrs = hostfile::resolve(&nodes, new_rank, &place)?;
    verbose!(
        rank,
        "split: forming color {color} as rank {new_rank} of {} (parent ranks {order:?})",
        order.len()
    );
    // The sub-group's flight records go to a directory of their own: its ranks are
    // numbered anew, and its files would overwrite the parent group's.
    let mut options = origin.options.clone();
    options.flight_dir = options
        .flight_dir
        .map(|dir| dir.join(format!("split-color{color}")));
    let group = form_ring(&addrs, &options).inspect_err(|e| {
        // The error names sub-group ranks; this says which parent ranks they are.
        verbose!(
            warn: rank,
            "split: forming color {color} failed: {e} (sub-group ranks 0.. are parent ranks \
             {order:?})"
        );
    })?;
    verbose!(
        info: rank,
        "split: color {color} formed; this rank is its rank {new_rank} of {}",
        order.len()
    );
    Ok(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn records_round_trip() {
        let ports = [addr("10.0.0.7:40001"), addr("10.0.1.7:40002")];
        let bytes = encode(3, -5, &ports, 2);
        assert_eq!(bytes.len(), HEAD + 2 * ADDRESS);
        let back = decode(&bytes).unwrap();
        assert_eq!(
            back,
            Record {
                color: 3,
                key: -5,
                ports: ports.to_vec()
            }
        );
        // A rank in no group sends zeros where its addresses would be.
        let none = decode(&encode(-1, 2, &[], 2)).unwrap();
        assert_eq!(none.color, -1);
        assert!(none.ports.iter().all(|a| a.port() == 0));
        assert_eq!(decode(&bytes[..3]), None);
    }

    #[test]
    fn members_are_ordered_by_key_then_parent_rank() {
        let rec = |color, key| Record {
            color,
            key,
            ports: Vec::new(),
        };
        let records = [
            rec(0, 5),
            rec(1, 0),
            rec(0, 1),
            rec(0, 5),
            rec(-1, 0),
            rec(0, 1),
        ];
        assert_eq!(members(&records, 0), [2, 5, 0, 3]);
        assert_eq!(members(&records, 1), [1]);
        assert_eq!(members(&records, 7), Vec::<usize>::new());
    }
}
