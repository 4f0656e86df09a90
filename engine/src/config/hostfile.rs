//! MLX's ring hostfile, which this project's docs call the *ring address file*: the file
//! `MLX_HOSTFILE` names, a JSON list with one entry per rank in rank order, each a list of
//! the `"host:port"` addresses that rank listens on (one TCP connection per address). It is
//! not the *launch hostfile* that `mlx.launch --hostfile` and `nuvec launch --hostfile` take
//! (the hosts to start ranks on, `[{"ssh": ..., "ips": [...]}]`), from which a launcher
//! writes this one.
//!
//! `[["10.0.0.1:5000","10.0.1.1:5001"],["10.0.0.2:5002","10.0.1.2:5003"]]` is a ring of two
//! ranks with two connections between neighbours. This module turns such a file, or the
//! same lists passed to [`init_with`](crate::init_with), into the addresses one rank uses:
//! its own (to listen on) and its right neighbour's (to connect to). Every problem is
//! reported with the file's name and the rank and address at fault, never as a panic.
//!
//! As in MLX, the host part ends at the first `:` (so IPv6 literals are not accepted), the
//! host may be a name, and only IPv4 is used. Entries of ranks other than this one and its
//! right neighbour only set the ring's size; they are checked for form but not resolved, so
//! placeholders for unreachable hosts work as they do with MLX.
//!
//! [`to_json`] writes a hostfile as `mlx.launch` does.

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::json_kind as kind;

use crate::error::{Error, Result};

/// What one rank needs from the hostfile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct RingAddresses {
    /// This rank.
    pub(crate) rank: usize,
    /// The number of ranks (entries in the file).
    pub(crate) size: usize,
    /// This rank's own addresses, to listen on: connection `i` from the left neighbour
    /// arrives at `listen[i]`.
    pub(crate) listen: Vec<SocketAddr>,
    /// The right neighbour's addresses: connection `i` goes to `right[i]`.
    pub(crate) right: Vec<SocketAddr>,
    /// Ranks whose first address names the same host as this rank's (this one included):
    /// the ranks likely to share this machine's CPUs.
    pub(crate) local_ranks: usize,
    /// Every rank's addresses as the hostfile writes them, in rank order: the native wire
    /// connects to ranks that are not neighbours ([`RingAddresses::first_address`]) and
    /// derives the group's identity from them. The MLX wire does not use them.
    pub(crate) all: Vec<Vec<String>>,
    /// The hostfile (or [`IN_CODE`]) they come from, for errors.
    pub(crate) origin: PathBuf,
    /// For a group formed by `Group::shrink`: the digest of the original group, the
    /// shrink's generation and its members, which the native wire's hello carries in the
    /// group identity so that survivors that decided differently cannot form together.
    /// `None` for a group formed from a hostfile or by `init_with`.
    pub(crate) shrunk: Option<[u8; 32]>,
}

impl RingAddresses {
    /// The left neighbour's rank.
    pub(crate) fn left_rank(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }

    /// The right neighbour's rank.
    pub(crate) fn right_rank(&self) -> usize {
        (self.rank + 1) % self.size
    }

    /// Rank `r`'s address `i` as the hostfile writes it (`"node-a:5000"`), for messages.
    pub(crate) fn written(&self, r: usize, i: usize) -> Option<&str> {
        self.all.get(r)?.get(i).map(String::as_str)
    }

    /// Rank `r`'s address `i`, resolved, for an error's `addr`: `None` when the entry is
    /// missing or does not resolve (a placeholder), since the error is about something
    /// else and must not fail for it.
    pub(crate) fn resolved(&self, r: usize, i: usize) -> Option<SocketAddr> {
        lookup(self.written(r, i)?).ok()
    }

    /// Resolves rank `r`'s first address, which the native wire connects to when `r` is not
    /// a neighbour. Entries other than the neighbours' are only resolved here, so the MLX
    /// wire keeps accepting placeholders there (port 0, hosts it cannot resolve).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the file, the rank and the address.
    pub(crate) fn first_address(&self, r: usize) -> Result<SocketAddr> {
        let fail = |reason: String| Error::Config {
            path: self.origin.clone(),
            reason,
        };
        let Some(written) = self.all.get(r).and_then(|a| a.first()) else {
            return Err(fail(format!(
                "rank {r} has no address in the hostfile's {} entries",
                self.all.len()
            )));
        };
        lookup(written).map_err(|why| {
            fail(format!(
                "rank {r}, address 0: {why} (the native wire connects every pair of ranks, so \
                 every rank's first address must be real)"
            ))
        })
    }
}

/// The name errors use for addresses passed to `init_with` rather than read from a file.
pub(crate) const IN_CODE: &str = "<addresses passed to init_with>";

/// Reads a hostfile into per-rank address strings, checking its shape. Errors name the file.
pub(crate) fn read(path: &Path) -> Result<Vec<Vec<String>>> {
    let fail = |reason: String| Error::Config {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(match e.kind() {
            std::io::ErrorKind::NotFound => "the hostfile does not exist".to_string(),
            _ => format!("the hostfile cannot be read: {e}"),
        })
    })?;
    parse(&text).map_err(fail)
}

/// Parses hostfile text into per-rank `"host:port"` lists, checking only that it is such a
/// list (see [`check`] for the addresses' form). The error is the reason only; the caller
/// adds the file's name.
///
/// # Errors
///
/// Text that is empty, not JSON, or not a list of lists of strings.
///
/// # Examples
///
/// ```
/// use nuvec_distributed_engine::config::hostfile;
///
/// let nodes = hostfile::parse(r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#)?;
/// assert_eq!(nodes[1], ["127.0.0.1:5001"]);
/// hostfile::check(&nodes, 0)?;
/// assert!(hostfile::parse(r#"[{"ssh": "node-a"}]"#).is_err()); // a launch hostfile
/// # Ok::<(), String>(())
/// ```
pub fn parse(text: &str) -> std::result::Result<Vec<Vec<String>>, String> {
    if text.trim().is_empty() {
        return Err(
            "the hostfile is empty (mlx.launch writes an empty hostfile for a single \
                    host; unset MLX_HOSTFILE to run one process alone)"
                .to_string(),
        );
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("the hostfile is not valid JSON: {e}"))?;
    let Value::Array(ranks) = value else {
        return Err(format!(
            "expected a JSON list with one list of \"host:port\" strings per rank, found {}",
            kind(&value)
        ));
    };
    ranks
        .iter()
        .enumerate()
        .map(|(rank, entry)| {
            let Value::Array(addresses) = entry else {
                return Err(format!(
                    "rank {rank}: expected a list of \"host:port\" strings, found {}",
                    kind(entry)
                ));
            };
            addresses
                .iter()
                .enumerate()
                .map(|(i, a)| match a {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(format!(
                        "rank {rank}, address {i}: expected a \"host:port\" string, found {}",
                        kind(other)
                    )),
                })
                .collect()
        })
        .collect()
}

/// Checks the per-rank lists and resolves the addresses `rank` uses. `origin` names the
/// file (or [`IN_CODE`]) in errors.
pub(crate) fn resolve(nodes: &[Vec<String>], rank: usize, origin: &Path) -> Result<RingAddresses> {
    check(nodes, rank).map_err(|reason| Error::Config {
        path: origin.to_path_buf(),
        reason,
    })?;
    let fail = |reason: String| Error::Config {
        path: origin.to_path_buf(),
        reason,
    };
    let size = nodes.len();
    let right = (rank + 1) % size;
    let host = |r: usize| nodes[r][0].split_once(':').map(|(h, _)| h);
    let local_ranks = (0..size).filter(|&r| host(r) == host(rank)).count();
    let resolve_all = |r: usize| -> Result<Vec<SocketAddr>> {
        nodes[r]
            .iter()
            .enumerate()
            .map(|(i, a)| lookup(a).map_err(|why| fail(format!("rank {r}, address {i}: {why}"))))
            .collect()
    };
    Ok(RingAddresses {
        rank,
        size,
        listen: if size > 1 {
            resolve_all(rank)?
        } else {
            Vec::new()
        },
        right: if size > 1 {
            resolve_all(right)?
        } else {
            Vec::new()
        },
        local_ranks,
        all: nodes.to_vec(),
        origin: origin.to_path_buf(),
        shrunk: None,
    })
}

/// Checks the per-rank lists as `init` would for `rank`, without resolving any host: `rank`
/// in range, the same number of addresses for every rank, each `"host:port"` with a port
/// number, no address listed twice. The error is the reason only.
///
/// # Errors
///
/// The first problem found, naming the rank and address.
///
/// # Examples
///
/// ```
/// use nuvec_distributed_engine::config::hostfile;
///
/// let nodes = vec![vec!["10.0.0.1:5000".to_string()], vec!["10.0.0.2".to_string()]];
/// let err = hostfile::check(&nodes, 0).unwrap_err();
/// assert!(err.contains("rank 1, address 0"), "{err}");
/// ```
pub fn check(nodes: &[Vec<String>], rank: usize) -> std::result::Result<(), String> {
    let fail = |reason: String| reason;
    if nodes.is_empty() {
        return Err(fail("the ring has no ranks (an empty list)".into()));
    }
    let size = nodes.len();
    if rank >= size {
        return Err(fail(format!(
            "rank {rank} is out of range: the ring has {size} rank{}",
            if size == 1 { "" } else { "s" }
        )));
    }
    let connections = nodes[0].len();
    for (r, entry) in nodes.iter().enumerate() {
        if entry.is_empty() {
            return Err(fail(format!("rank {r} lists no addresses")));
        }
        if entry.len() != connections {
            return Err(fail(format!(
                "every rank must list the same number of addresses (one per connection), but \
                 rank 0 lists {connections} and rank {r} lists {}",
                entry.len()
            )));
        }
        for (i, address) in entry.iter().enumerate() {
            split(address).map_err(|why| fail(format!("rank {r}, address {i}: {why}")))?;
        }
    }
    // Two connections cannot share a listening port. Port 0 marks a placeholder (exo
    // writes those for ranks that are not neighbours), which may repeat.
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (r, entry) in nodes.iter().enumerate() {
        for address in entry.iter().filter(|a| !a.ends_with(":0")) {
            if let Some(q) = seen.insert(address, r) {
                return Err(fail(format!(
                    "address {address:?} is listed twice (rank {q} and rank {r}): every \
                     connection needs its own port"
                )));
            }
        }
    }
    Ok(())
}

/// Splits `"host:port"` at the first `:` as MLX does, and checks the port's form.
fn split(address: &str) -> std::result::Result<(&str, u16), String> {
    let Some((host, port)) = address.split_once(':') else {
        return Err(format!("{address:?} is not of the form \"host:port\""));
    };
    if host.is_empty() {
        return Err(format!("{address:?} has no host before the ':'"));
    }
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{address:?}: {port:?} is not a port number (IPv6 literals are not supported, as \
             in MLX)"
        ));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{address:?}: port {port} is out of range (1 to 65535)"))?;
    Ok((host, port))
}

/// Resolves one address this rank will use to an IPv4 socket address.
fn lookup(address: &str) -> std::result::Result<SocketAddr, String> {
    let (host, port) = split(address)?;
    if port == 0 {
        return Err(format!(
            "{address:?}: port 0 cannot be used by this rank or its neighbour"
        ));
    }
    let candidates = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{address:?}: cannot resolve host {host:?}: {e}"))?;
    let mut found_v6 = false;
    for candidate in candidates {
        match candidate {
            SocketAddr::V4(v4) => return Ok(SocketAddr::V4(SocketAddrV4::new(*v4.ip(), port))),
            SocketAddr::V6(_) => found_v6 = true,
        }
    }
    Err(if found_v6 {
        format!("{address:?}: host {host:?} has only IPv6 addresses; the ring uses IPv4, as MLX's")
    } else {
        format!("{address:?}: host {host:?} has no addresses")
    })
}

/// The path used in errors for addresses from code.
pub(crate) fn in_code() -> PathBuf {
    PathBuf::from(IN_CODE)
}

/// A hostfile's text for `nodes` (per rank, its `"host:port"` addresses), byte for byte as
/// `mlx.launch` writes it: Python's `json.dumps` (`", "` between items, everything outside
/// printable ASCII escaped). [`init`](crate::init) reads it back.
///
/// `mlx.launch` writes an empty file instead for a single host, which `init` refuses; that
/// choice is the launcher's, so this function always writes the list.
pub fn to_json(nodes: &[Vec<String>]) -> String {
    let mut out = String::new();
    super::push_python_list(&mut out, nodes, |out, addresses| {
        super::push_python_list(out, addresses, |out, a| super::push_python_string(out, a));
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(v: &[&[&str]]) -> Vec<Vec<String>> {
        v.iter()
            .map(|e| e.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    fn reason(e: Error) -> String {
        match e {
            Error::Config { reason, .. } => reason,
            other => panic!("not a config error: {other}"),
        }
    }

    #[test]
    fn parses_mlx_hostfiles() {
        let n =
            parse(r#"[["127.0.0.1:5000","127.0.0.1:5001"],["localhost:5002","127.0.0.1:5003"]]"#)
                .unwrap();
        assert_eq!(n.len(), 2);
        let a = resolve(&n, 1, Path::new("h.json")).unwrap();
        assert_eq!(a.listen.len(), 2);
        assert_eq!(a.listen[0], "127.0.0.1:5002".parse().unwrap());
        assert_eq!(a.right[1], "127.0.0.1:5001".parse().unwrap());
        assert_eq!((a.left_rank(), a.right_rank()), (0, 0));
        // "localhost" and "127.0.0.1" are compared as written.
        assert_eq!(a.local_ranks, 1);
    }

    #[test]
    fn rejects_malformed_files_with_reasons() {
        assert!(parse("").unwrap_err().contains("empty"));
        assert!(parse("  \n").unwrap_err().contains("empty"));
        assert!(parse("[[\"a:1\"]").unwrap_err().contains("not valid JSON"));
        assert!(parse("{}").unwrap_err().contains("found an object"));
        assert!(
            parse("[\"a:1\"]")
                .unwrap_err()
                .contains("rank 0: expected a list")
        );
        assert!(
            parse("[[\"a:1\"],[5]]")
                .unwrap_err()
                .contains("rank 1, address 0")
        );
    }

    #[test]
    fn rejects_bad_rings() {
        let p = Path::new("hosts.json");
        assert!(reason(resolve(&[], 0, p).unwrap_err()).contains("no ranks"));
        let two = nodes(&[&["127.0.0.1:1"], &["127.0.0.1:2"]]);
        assert!(reason(resolve(&two, 2, p).unwrap_err()).contains("rank 2 is out of range"));
        let unequal = nodes(&[&["127.0.0.1:1"], &["127.0.0.1:2", "127.0.0.1:3"]]);
        assert!(reason(resolve(&unequal, 0, p).unwrap_err()).contains("same number"));
        let empty = nodes(&[&["127.0.0.1:1"], &[]]);
        assert!(reason(resolve(&empty, 0, p).unwrap_err()).contains("rank 1 lists no"));
        let port = nodes(&[&["127.0.0.1:1"], &["127.0.0.1:70000"]]);
        assert!(reason(resolve(&port, 0, p).unwrap_err()).contains("out of range"));
        let noport = nodes(&[&["127.0.0.1"], &["127.0.0.1:2"]]);
        assert!(reason(resolve(&noport, 0, p).unwrap_err()).contains("host:port"));
        let v6 = nodes(&[&["[::1]:1"], &["127.0.0.1:2"]]);
        assert!(reason(resolve(&v6, 0, p).unwrap_err()).contains("IPv6"));
        let dup = nodes(&[&["127.0.0.1:7"], &["127.0.0.1:7"]]);
        assert!(reason(resolve(&dup, 0, p).unwrap_err()).contains("listed twice"));
        let unresolvable = nodes(&[&["no-such-host.invalid:1"], &["127.0.0.1:2"]]);
        assert!(reason(resolve(&unresolvable, 0, p).unwrap_err()).contains("cannot resolve"));
    }

    #[test]
    fn other_ranks_entries_are_not_resolved() {
        // exo writes placeholders for ranks that are not neighbours.
        let n = nodes(&[
            &["127.0.0.1:1"],
            &["127.0.0.1:2"],
            &["no-such-host.invalid:0"],
            &["127.0.0.1:4"],
        ]);
        let a = resolve(&n, 0, Path::new("h")).unwrap();
        // The native wire resolves them when it needs them, naming the file and rank.
        assert_eq!(a.first_address(3).unwrap(), "127.0.0.1:4".parse().unwrap());
        assert_eq!(a.all, n);
        let e = a.first_address(2).unwrap_err().to_string();
        assert!(
            e.starts_with("h: rank 2, address 0:") && e.contains("native wire"),
            "{e}"
        );
        assert!(
            a.first_address(4)
                .unwrap_err()
                .to_string()
                .contains("rank 4")
        );
    }

    #[test]
    fn errors_name_the_file() {
        let e = read(Path::new("/nonexistent/hosts.json")).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("/nonexistent/hosts.json") && text.contains("does not exist"));
    }
}
