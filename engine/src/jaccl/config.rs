//! JACCL's configuration as MLX reads it: the environment, the device file, MLX's validity
//! rules and its choice between the mesh and the ring.
//!
//! `mlx.launch --backend jaccl` (or `jaccl-ring`) sets `MLX_RANK`, `MLX_IBV_DEVICES` (a device
//! file), `MLX_JACCL_COORDINATOR` (`ip:port` where rank 0 listens for the side channel) and,
//! for `jaccl-ring`, `MLX_JACCL_RING`. Each may also be given with the `JACCL_` prefix, which is
//! looked up first.
//!
//! The device file is a JSON array of P rows of P cells; cell `[i][j]` says how rank `i`
//! reaches rank `j`: `null` (not at all; required on the diagonal), a device name such as
//! `"rdma_en5"`, or a list of names (one per cable). Errors name the file, the rank and the
//! cell at fault.
//!
//! Where this differs from MLX (v0.32.1):
//!
//! - A rank that is not a whole number is an error naming the variable; MLX's `atoi` reads
//!   it as 0.
//! - An empty device name, and a ring whose neighbour cells are all empty, are errors; MLX
//!   accepts both and then has no device to open (the second crashes it).
//! - Once the device file and the coordinator are given, a configuration that is not a valid
//!   mesh or ring is an error even without `strict`, as for the ring backend's hostfile;
//!   MLX silently returns no group.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use super::frames::{MESH_MAX_RANKS, RING_MAX_CONNECTIONS, SizeClasses};
use crate::config::{devices, env};
use crate::error::{Error, Result};

// The variables are named (and read) in `config::env`; these are their names here.
pub use crate::config::env::{
    JACCL_COORDINATOR_VARS as COORDINATOR_VARS, JACCL_DEVICES_VARS as DEVICES_VARS,
    JACCL_RANK_VARS as RANK_VARS, JACCL_RING_VARS as RING_VARS,
};

/// The name errors use for a device matrix built in code rather than read from a file.
const IN_CODE: &str = "<devices passed in code>";

/// Which devices connect which ranks: P rows of P cells, each a list of device names
/// (empty: no connection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceMatrix {
    cells: Vec<Vec<Vec<String>>>,
    source: PathBuf,
}

impl DeviceMatrix {
    /// Reads a device file.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the file and, for a malformed file, the row or cell.
    pub fn from_file(path: &Path) -> Result<DeviceMatrix> {
        Ok(DeviceMatrix {
            cells: devices::read(path)?,
            source: path.to_path_buf(),
        })
    }

    /// Parses a device file's text; `source` names it in errors.
    ///
    /// # Errors
    ///
    /// As [`DeviceMatrix::from_file`].
    pub fn parse(text: &str, source: &Path) -> Result<DeviceMatrix> {
        Ok(DeviceMatrix {
            cells: devices::parse(text, source)?,
            source: source.to_path_buf(),
        })
    }

    /// A matrix from code: `cells[i][j]` lists the devices rank `i` reaches rank `j` by.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if the matrix is not square or names an empty device.
    pub fn new(cells: Vec<Vec<Vec<String>>>) -> Result<DeviceMatrix> {
        let size = cells.len();
        for (rank, row) in cells.iter().enumerate() {
            if row.len() != size {
                return Err(Error::invalid(format!(
                    "device matrix row {rank} has {} cells, but there are {size} rows",
                    row.len()
                )));
            }
            if row.iter().flatten().any(String::is_empty) {
                return Err(Error::invalid(format!(
                    "device matrix row {rank} names an empty device"
                )));
            }
        }
        Ok(DeviceMatrix {
            cells,
            source: PathBuf::from(IN_CODE),
        })
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.cells.len()
    }

    /// The file the matrix came from (or a placeholder for one built in code).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The devices rank `from` reaches rank `to` by.
    ///
    /// # Panics
    ///
    /// If either rank is out of range.
    pub fn cell(&self, from: usize, to: usize) -> &[String] {
        &self.cells[from][to]
    }

    /// Why the matrix is not a valid mesh, or `None` if it is one: at least two ranks, an
    /// empty diagonal, and every other cell non-empty (only its first device is used).
    pub fn mesh_problem(&self) -> Option<String> {
        let p = self.size();
        if p < 2 {
            return Some(format!("a mesh needs at least 2 ranks, not {p}"));
        }
        for from in 0..p {
            for to in 0..p {
                let cell = self.cell(from, to);
                if from == to && !cell.is_empty() {
                    return Some(format!(
                        "cell [{from}][{to}] names {}, but a rank does not connect to itself",
                        cell.join(", ")
                    ));
                }
                if from != to && cell.is_empty() {
                    return Some(format!(
                        "cell [{from}][{to}] is empty, but a mesh connects rank {from} to every \
                         other rank"
                    ));
                }
            }
        }
        None
    }

    /// Why the matrix is not a valid ring, or `None` if it is one: at least two ranks, and
    /// every rank's cells towards its left and right neighbours list as many devices as cell
    /// `[0][1]`, at least one. Other cells are ignored, so a full mesh is also a ring.
    pub fn ring_problem(&self) -> Option<String> {
        let p = self.size();
        if p < 2 {
            return Some(format!("a ring needs at least 2 ranks, not {p}"));
        }
        let wires = self.cell(0, 1).len();
        if wires == 0 {
            return Some(
                "cell [0][1] is empty, but a ring connects every rank to its right neighbour"
                    .into(),
            );
        }
        for from in 0..p {
            for (to, side) in [((from + p - 1) % p, "left"), ((from + 1) % p, "right")] {
                let n = self.cell(from, to).len();
                if n != wires {
                    return Some(format!(
                        "cell [{from}][{to}] (rank {from} to its {side} neighbour) lists {n} \
                         device(s) but cell [0][1] lists {wires}: every neighbour cell of a ring \
                         lists the same number"
                    ));
                }
            }
        }
        None
    }

    /// Whether the matrix is a valid mesh ([`DeviceMatrix::mesh_problem`]).
    pub fn is_valid_mesh(&self) -> bool {
        self.mesh_problem().is_none()
    }

    /// Whether the matrix is a valid ring ([`DeviceMatrix::ring_problem`]).
    pub fn is_valid_ring(&self) -> bool {
        self.ring_problem().is_none()
    }
}

/// How a rank's connections are laid out, with the devices it opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Every rank connects to every other: `devices[p]` is the device towards rank `p`
    /// (`None` for this rank itself).
    Mesh {
        /// The device towards each rank.
        devices: Vec<Option<String>>,
    },
    /// Every rank connects to its neighbours with `left.len() == right.len()` wires each.
    Ring {
        /// The devices towards the left neighbour, one per wire.
        left: Vec<String>,
        /// The devices towards the right neighbour, one per wire.
        right: Vec<String>,
    },
}

impl Topology {
    /// `"mesh"` or `"ring"`.
    pub fn name(&self) -> &'static str {
        match self {
            Topology::Mesh { .. } => "mesh",
            Topology::Ring { .. } => "ring",
        }
    }
}

/// Everything a rank needs to join a JACCL group.
///
/// Read from the environment as MLX reads it ([`Config::from_env`]), or built in code
/// ([`Config::new`]). Where this differs from MLX 0.32.1:
///
/// - a rank that is not a whole number is an error naming the variable (MLX's `atoi` reads
///   it as 0);
/// - an empty device name, and a ring whose neighbour cells are all empty, are errors (MLX
///   accepts both and then has no device to open; the second crashes it);
/// - once the device file and the coordinator are given, a configuration that is neither a
///   valid mesh nor a valid ring is an error even without `strict` (MLX silently forms no
///   group), as for the TCP ring's hostfile.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// This process's rank.
    pub rank: usize,
    /// `ip:port` where rank 0 listens for the side channel.
    pub coordinator: Option<String>,
    /// The device matrix (from the device file).
    pub devices: Option<DeviceMatrix>,
    /// Whether the ring is preferred when the matrix is both a mesh and a ring.
    pub prefer_ring: bool,
    /// The message sizes (a property of the macOS release; see [`SizeClasses`]).
    pub buffers: SizeClasses,
    /// Which all_gather the MLX ranks of a jaccl-ring group run (see [`MlxAllGather`]).
    pub mlx_all_gather: MlxAllGather,
}

/// Which ring all_gather the MLX ranks of a jaccl-ring group run, as the user declares it:
/// nothing MLX sends tells its release.
///
/// Nuvec ranks recognise each other at set-up (a mark in the padding of the records they
/// publish, which MLX never reads), so a ring of nuvec ranks alone knows its all_gather is
/// right. A ring with MLX ranks cannot know which MLX: MLX 0.32.1's ring all_gather is
/// defective (it sends the lower half of each block in both directions and leaves most of the
/// output unfilled), and MLX PR #4443 fixes it, with the same messages as this crate's. So
/// by default nuvec ranks in a mixed ring refuse all_gather (after exchanging its messages,
/// so that the group stays in step and usable), and [`MlxAllGather::Fixed`] lets it run.
/// Meshes are unaffected: MLX's mesh all_gather is right.
///
/// Read from [`MLX_ALL_GATHER_VAR`]: `defective` or `fixed`.
///
/// # Examples
///
/// ```
/// use nuvec_distributed_engine::jaccl::MlxAllGather;
///
/// assert_eq!("fixed".parse::<MlxAllGather>().unwrap(), MlxAllGather::Fixed);
/// assert_eq!(MlxAllGather::default(), MlxAllGather::Defective);
/// assert!("0.32.1".parse::<MlxAllGather>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MlxAllGather {
    /// MLX 0.32.1's, or any release before PR #4443: all_gather in a mixed ring is refused.
    #[default]
    Defective,
    /// A release with PR #4443: all_gather in a mixed ring runs.
    Fixed,
}

/// The variable [`MlxAllGather`] is read from.
pub use crate::config::env::JACCL_MLX_ALL_GATHER_VAR as MLX_ALL_GATHER_VAR;

impl std::str::FromStr for MlxAllGather {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "defective" => Ok(MlxAllGather::Defective),
            "fixed" => Ok(MlxAllGather::Fixed),
            other => Err(Error::Environment {
                var: MLX_ALL_GATHER_VAR,
                reason: format!(
                    "{other:?} is neither \"defective\" (MLX 0.32.1's ring all_gather, the \
                     default) nor \"fixed\" (a release with MLX PR #4443)"
                ),
            }),
        }
    }
}

impl Config {
    /// A configuration from code.
    pub fn new(rank: usize, coordinator: impl Into<String>, devices: DeviceMatrix) -> Config {
        Config {
            rank,
            coordinator: Some(coordinator.into()),
            devices: Some(devices),
            prefer_ring: false,
            buffers: SizeClasses::Large,
            mlx_all_gather: MlxAllGather::Defective,
        }
    }

    /// Sets which all_gather the MLX ranks of a ring run.
    pub fn mlx_all_gather(mut self, mlx: MlxAllGather) -> Config {
        self.mlx_all_gather = mlx;
        self
    }

    /// Sets whether the ring is preferred.
    pub fn prefer_ring(mut self, prefer: bool) -> Config {
        self.prefer_ring = prefer;
        self
    }

    /// Sets the size classes.
    pub fn buffers(mut self, buffers: SizeClasses) -> Config {
        self.buffers = buffers;
        self
    }

    /// Reads the configuration from the environment, as MLX's `jaccl::Config::from_env`:
    /// the rank ([`RANK_VARS`], 0 if unset), the device file ([`DEVICES_VARS`]), the
    /// coordinator ([`COORDINATOR_VARS`]) and the ring preference ([`RING_VARS`]), each
    /// `JACCL_*` name before its `MLX_*` one; plus the size classes
    /// ([`SizeClasses::detect`]) and which all_gather MLX ranks run ([`MLX_ALL_GATHER_VAR`]).
    /// Settings that are absent stay `None`.
    ///
    /// # Errors
    ///
    /// A rank that is not a whole number, an unreadable or malformed device file, a bad
    /// size-class override, or an [`MLX_ALL_GATHER_VAR`] that is neither value.
    pub fn from_env() -> Result<Config> {
        let launch = env::jaccl_launch(&env::process)?;
        let devices = match &launch.devices {
            None => None,
            Some(path) => Some(DeviceMatrix::from_file(path)?),
        };
        Ok(Config {
            rank: launch.rank,
            coordinator: launch.coordinator,
            devices,
            prefer_ring: launch.prefer_ring,
            buffers: SizeClasses::detect()?,
            mlx_all_gather: env::value(&env::process, MLX_ALL_GATHER_VAR)?
                .map(|v| v.parse())
                .transpose()?
                .unwrap_or_default(),
        })
    }

    /// The number of ranks (0 without a device matrix).
    pub fn size(&self) -> usize {
        self.devices.as_ref().map_or(0, DeviceMatrix::size)
    }

    /// What is missing for this configuration to describe a group, as MLX's `is_valid`
    /// checks it before anything else: a device matrix and a coordinator. `None` if both are
    /// there.
    pub fn missing(&self) -> Option<String> {
        let mut missing = Vec::new();
        if self.devices.is_none() {
            missing.push(format!(
                "a device file ({} or {})",
                DEVICES_VARS[0], DEVICES_VARS[1]
            ));
        }
        if self.coordinator.is_none() {
            missing.push(format!(
                "a coordinator address ({} or {})",
                COORDINATOR_VARS[0], COORDINATOR_VARS[1]
            ));
        }
        (!missing.is_empty()).then(|| {
            format!(
                "JACCL needs {} (as mlx.launch --backend jaccl sets them)",
                missing.join(" and ")
            )
        })
    }

    /// The topology this rank joins, chosen as MLX chooses it: the ring if preferred and
    /// valid, else the mesh if valid, else the ring if valid.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the device file: the rank is out of range, the matrix is
    /// neither a mesh nor a ring (with the first cell that breaks each), the mesh has more
    /// than 8 ranks, or the ring more than 4 devices per neighbour (MLX's limits).
    /// [`Error::InvalidArgument`] without a device matrix.
    pub fn topology(&self) -> Result<Topology> {
        let matrix = self
            .devices
            .as_ref()
            .ok_or_else(|| Error::invalid("a JACCL configuration needs a device matrix"))?;
        let fail = |reason: String| Error::Config {
            path: matrix.source().to_path_buf(),
            reason,
        };
        let (p, rank) = (matrix.size(), self.rank);
        if rank >= p {
            return Err(fail(format!(
                "rank {rank} is out of range: the device file describes {p} rank(s) ({} or {} \
                 holds the rank)",
                RANK_VARS[0], RANK_VARS[1]
            )));
        }
        let mesh = matrix.mesh_problem();
        let ring = matrix.ring_problem();
        let use_ring = match (&mesh, &ring) {
            (_, None) if self.prefer_ring => true,
            (None, _) => false,
            (_, None) => true,
            (Some(mesh), Some(ring)) => {
                return Err(fail(format!(
                    "the devices form neither a mesh ({mesh}) nor a ring ({ring})"
                )));
            }
        };
        if use_ring {
            let left = matrix.cell(rank, (rank + p - 1) % p).to_vec();
            let right = matrix.cell(rank, (rank + 1) % p).to_vec();
            if left.len() > RING_MAX_CONNECTIONS {
                return Err(fail(format!(
                    "the ring lists {} devices per neighbour (cell [0][1]); MLX's JACCL ring \
                     uses at most {RING_MAX_CONNECTIONS}",
                    left.len()
                )));
            }
            return Ok(Topology::Ring { left, right });
        }
        if p > MESH_MAX_RANKS {
            let hint = if ring.is_none() {
                format!(
                    "; the devices also form a valid ring, which {} (mlx.launch --backend \
                     jaccl-ring) selects",
                    RING_VARS[1]
                )
            } else {
                String::new()
            };
            return Err(fail(format!(
                "the mesh has {p} ranks; MLX's JACCL mesh supports at most {MESH_MAX_RANKS}{hint}"
            )));
        }
        let devices = (0..p)
            .map(|peer| (peer != rank).then(|| matrix.cell(rank, peer)[0].clone()))
            .collect();
        Ok(Topology::Mesh { devices })
    }

    /// The coordinator's IPv4 address, resolved. As in MLX the host ends at the first `:`.
    ///
    /// # Errors
    ///
    /// [`Error::Environment`] if there is no coordinator, it has no port, or its host does
    /// not resolve to an IPv4 address.
    pub fn coordinator_addr(&self) -> Result<SocketAddr> {
        let var = COORDINATOR_VARS[1];
        let text = self
            .coordinator
            .as_deref()
            .ok_or_else(|| Error::Environment {
                var,
                reason: "no coordinator address is set".into(),
            })?;
        let bad = |why: String| Error::Environment {
            var,
            reason: format!("coordinator {text:?}: {why}"),
        };
        let (host, port) = text
            .split_once(':')
            .ok_or_else(|| bad("expected ip:port".into()))?;
        let port: u16 = port
            .trim()
            .parse()
            .map_err(|_| bad(format!("{port:?} is not a port")))?;
        (host.trim(), port)
            .to_socket_addrs()
            .map_err(|e| bad(format!("cannot resolve {host:?}: {e}")))?
            .find(SocketAddr::is_ipv4)
            .ok_or_else(|| bad(format!("{host:?} has no IPv4 address")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(json: &str) -> Result<DeviceMatrix> {
        DeviceMatrix::parse(json, Path::new("devices.json"))
    }

    fn config(json: &str, rank: usize) -> Config {
        Config::new(rank, "127.0.0.1:32323", matrix(json).unwrap())
    }

    fn reason(e: Error) -> String {
        match e {
            Error::Config { path, reason } => {
                assert_eq!(path, Path::new("devices.json"));
                reason
            }
            other => panic!("expected a device-file error, got {other}"),
        }
    }

    /// A full mesh of `p` ranks, `rdma_en<i><j>` from i to j.
    fn mesh_json(p: usize) -> String {
        let rows: Vec<String> = (0..p)
            .map(|i| {
                let cells: Vec<String> = (0..p)
                    .map(|j| {
                        if i == j {
                            "null".into()
                        } else {
                            format!("\"rdma_en{i}{j}\"")
                        }
                    })
                    .collect();
                format!("[{}]", cells.join(","))
            })
            .collect();
        format!("[{}]", rows.join(","))
    }

    #[test]
    fn cells_are_null_a_name_or_a_list() {
        let m = matrix(r#"[[null, "a"], [["b", "c"], []]]"#).unwrap();
        assert_eq!(m.size(), 2);
        assert_eq!(m.cell(0, 0), [] as [String; 0]);
        assert_eq!(m.cell(0, 1), ["a"]);
        assert_eq!(m.cell(1, 0), ["b", "c"]);
        assert!(m.cell(1, 1).is_empty());
    }

    #[test]
    fn malformed_files_name_the_row_or_cell() {
        let e = reason(matrix("{}").unwrap_err());
        assert!(e.contains("JSON array"), "{e}");
        let e = reason(matrix("[[null]").unwrap_err());
        assert!(e.contains("not valid JSON"), "{e}");
        let e = reason(matrix(r#"[[null, "a"], [null]]"#).unwrap_err());
        assert!(e.contains("row 1 (rank 1) has 1 cells"), "{e}");
        let e = reason(matrix(r#"[[null, "a"], 5]"#).unwrap_err());
        assert!(e.contains("row 1 (rank 1) is the number 5"), "{e}");
        let e = reason(matrix(r#"[[null, 3], ["a", null]]"#).unwrap_err());
        assert!(
            e.contains("cell [0][1] (how rank 0 reaches rank 1) is the number 3"),
            "{e}"
        );
        let e = reason(matrix(r#"[[null, ["a", 2]], ["a", null]]"#).unwrap_err());
        assert!(e.contains("cell [0][1]") && e.contains("entry 1"), "{e}");
        let e = reason(matrix(r#"[[null, ""], ["a", null]]"#).unwrap_err());
        assert!(
            e.contains("cell [0][1]") && e.contains("empty device"),
            "{e}"
        );
    }

    #[test]
    fn a_full_matrix_is_a_mesh_and_a_ring_and_the_mesh_wins_unless_the_ring_is_preferred() {
        let c = config(&mesh_json(3), 1);
        assert!(c.devices.as_ref().unwrap().is_valid_mesh());
        assert!(c.devices.as_ref().unwrap().is_valid_ring());
        assert_eq!(
            c.topology().unwrap(),
            Topology::Mesh {
                devices: vec![Some("rdma_en10".into()), None, Some("rdma_en12".into())]
            }
        );
        assert_eq!(
            c.prefer_ring(true).topology().unwrap(),
            Topology::Ring {
                left: vec!["rdma_en10".into()],
                right: vec!["rdma_en12".into()]
            }
        );
    }

    #[test]
    fn the_mesh_uses_the_first_device_of_each_cell() {
        let c = config(r#"[[null, ["a", "b"]], [["c", "d"], null]]"#, 0);
        assert_eq!(
            c.topology().unwrap(),
            Topology::Mesh {
                devices: vec![None, Some("a".into())]
            }
        );
    }

    #[test]
    fn a_ring_only_needs_neighbour_cells_with_equal_counts() {
        // Four ranks in a ring of two cables; ranks 0 and 2 are not connected.
        let json = r#"[
            [null, ["a1","a2"], null, ["b1","b2"]],
            [["c1","c2"], null, ["d1","d2"], null],
            [null, ["e1","e2"], null, ["f1","f2"]],
            [["g1","g2"], null, ["h1","h2"], null]
        ]"#;
        let c = config(json, 2);
        let m = c.devices.as_ref().unwrap();
        assert!(!m.is_valid_mesh());
        assert!(m.is_valid_ring());
        assert_eq!(
            c.topology().unwrap(),
            Topology::Ring {
                left: vec!["e1".into(), "e2".into()],
                right: vec!["f1".into(), "f2".into()]
            }
        );
        // Two ranks: left and right are the same cell.
        let c = config(r#"[[null, "x"], ["y", null]]"#, 1).prefer_ring(true);
        assert_eq!(
            c.topology().unwrap(),
            Topology::Ring {
                left: vec!["y".into()],
                right: vec!["y".into()]
            }
        );
    }

    #[test]
    fn neither_mesh_nor_ring_names_the_cells_that_break_each() {
        let json = r#"[
            [null, "a", null, "b"],
            ["c", null, ["d", "e"], null],
            [null, "f", null, "g"],
            ["h", null, "i", null]
        ]"#;
        let e = reason(config(json, 0).topology().unwrap_err());
        assert!(e.contains("neither a mesh"), "{e}");
        assert!(e.contains("cell [0][2] is empty"), "{e}");
        assert!(
            e.contains("cell [1][2] (rank 1 to its right neighbour) lists 2"),
            "{e}"
        );
    }

    #[test]
    fn diagonal_devices_and_empty_rings_are_rejected() {
        // Not a mesh, but still a ring: the ring ignores the diagonal, as MLX's does.
        let c = config(r#"[["x", "a"], ["b", null]]"#, 0);
        let e = c.devices.as_ref().unwrap().mesh_problem().unwrap();
        assert!(e.contains("cell [0][0] names x"), "{e}");
        assert!(matches!(c.topology(), Ok(Topology::Ring { .. })));
        let m = matrix("[[null, null], [null, null]]").unwrap();
        assert!(m.ring_problem().unwrap().contains("cell [0][1] is empty"));
    }

    #[test]
    fn ranks_out_of_range_and_mlx_limits_are_errors() {
        let e = reason(config(&mesh_json(2), 2).topology().unwrap_err());
        assert!(
            e.contains("rank 2 is out of range") && e.contains("2 rank"),
            "{e}"
        );
        let e = reason(config(&mesh_json(9), 0).topology().unwrap_err());
        assert!(
            e.contains("at most 8") && e.contains("MLX_JACCL_RING"),
            "{e}"
        );
        // The same 9 ranks as a ring are fine.
        assert!(matches!(
            config(&mesh_json(9), 8).prefer_ring(true).topology(),
            Ok(Topology::Ring { .. })
        ));
        let five = r#"[[null, ["a","b","c","d","e"]], [["a","b","c","d","e"], null]]"#;
        let e = reason(config(five, 0).prefer_ring(true).topology().unwrap_err());
        assert!(e.contains("at most 4"), "{e}");
    }

    #[test]
    fn one_rank_is_neither_mesh_nor_ring() {
        let m = matrix("[[null]]").unwrap();
        assert!(!m.is_valid_mesh() && !m.is_valid_ring());
    }

    #[test]
    fn coordinators_split_at_the_first_colon_and_resolve_to_ipv4() {
        let mut c = config(&mesh_json(2), 0);
        assert_eq!(
            c.coordinator_addr().unwrap(),
            "127.0.0.1:32323".parse().unwrap()
        );
        c.coordinator = Some("localhost:7".into());
        assert_eq!(c.coordinator_addr().unwrap().port(), 7);
        for bad in ["127.0.0.1", "127.0.0.1:x", "::1:5"] {
            c.coordinator = Some(bad.into());
            let e = c.coordinator_addr().unwrap_err().to_string();
            assert!(e.contains("MLX_JACCL_COORDINATOR"), "{e}");
        }
    }

    #[test]
    fn missing_settings_are_named() {
        let c = Config {
            rank: 0,
            coordinator: None,
            devices: None,
            prefer_ring: false,
            buffers: SizeClasses::Large,
            mlx_all_gather: MlxAllGather::Defective,
        };
        let m = c.missing().unwrap();
        assert!(
            m.contains("MLX_IBV_DEVICES") && m.contains("MLX_JACCL_COORDINATOR"),
            "{m}"
        );
        assert!(config(&mesh_json(2), 0).missing().is_none());
    }

    #[test]
    fn matrices_from_code_must_be_square() {
        assert!(DeviceMatrix::new(vec![vec![vec![]], vec![vec![]]]).is_err());
        let m = DeviceMatrix::new(vec![
            vec![vec![], vec!["a".into()]],
            vec![vec!["b".into()], vec![]],
        ])
        .unwrap();
        assert!(m.is_valid_mesh());
    }
}
