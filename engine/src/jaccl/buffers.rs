//! Which registered buffers a group has, how big each is, and which connections each is
//! registered with: MLX 0.32.1's layout (`mesh.cpp`, `ring.cpp`), as a pure plan whose
//! [`BufferSpec`]s both fabrics allocate from; and [`Mem`], what the machines work on.
//!
//! Connections are numbered the same way everywhere in this module's users:
//!
//! - **mesh**: connection `p` leads to rank `p` (this rank's own number is unused);
//! - **ring**: connection `w` is wire `w` to the left neighbour, connection `W + w` wire `w`
//!   to the right neighbour, for `W` wires.
//!
//! For every size class `k` and pipeline slot `b` there are:
//!
//! - **mesh**: `P` buffers, where slot `rank` is the *send* buffer, registered with every
//!   peer's connection so one buffer is posted to all of them, and slot `p` receives from rank
//!   `p`; plus `2P` *scatter* buffers, slot `p` sending to and slot `P + p` receiving from rank
//!   `p` (sum_scatter sends each peer different data). That is 64 memory regions per
//!   connection with every class (16 send, 16 receive, 16 scatter send, 16 scatter receive).
//! - **ring**: per direction `d` (0 sends right and receives left, 1 the reverse) and wire
//!   `w`, one send and one receive buffer: 32 regions per connection.
//!
//! Classes a machine never uses (everything above 4 KiB on macOS 26.2) are left out: the
//! plan still numbers them, so indices do not depend on the macOS release, but the fabrics
//! allocate and register only what is used. The regions count against Apple's reported limit
//! of about 100 per device.

use super::frames::{CLASSES, Class, PIPELINE, SizeClasses};
use crate::transport::rdma::fabric::{BufId, BufferSpec};

/// What a collective's machines work on besides the fabric: the caller's memory, the
/// group's buffers and its staging memory.
pub(crate) struct Mem<'a> {
    /// What receives write: the array of an all-reduce, the output of the others. Also what
    /// sends read when there is no separate input.
    pub(crate) data: &'a mut [u8],
    /// A separate, read-only input (sum_scatter's, send's); `None` when the input is `data`.
    pub(crate) input: Option<&'a [u8]>,
    /// Which buffer is which.
    pub(crate) plan: &'a BufferPlan,
    /// Page-sized staging for the mesh all-reduce's own chunks (two largest buffers).
    pub(crate) staging: &'a mut [u8],
}

impl Mem<'_> {
    /// Input bytes `[start, start + len)`.
    pub(crate) fn input(&self, start: usize, len: usize) -> &[u8] {
        match self.input {
            Some(input) => &input[start..start + len],
            None => &self.data[start..start + len],
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Mesh { rank: usize, size: usize },
    Ring { wires: usize },
}

/// Every buffer a group has, in MLX's order: [`BufId`] `i` is `buffers[i]`, a message of
/// its size class.
#[derive(Clone, Debug)]
pub(crate) struct BufferPlan {
    shape: Shape,
    /// Buffers per (class, slot) tile.
    tile: usize,
    pub(crate) buffers: Vec<BufferSpec>,
}

impl BufferPlan {
    /// The buffers of rank `rank` in a mesh of `size` ranks. Per (class, slot) tile: one
    /// buffer per rank (this rank's own goes to every peer, a peer's to that peer), then two
    /// per rank (none for this rank).
    pub(crate) fn mesh(rank: usize, size: usize, classes: SizeClasses) -> BufferPlan {
        let peers: Vec<usize> = (0..size).filter(|&p| p != rank).collect();
        BufferPlan::tiled(Shape::Mesh { rank, size }, 3 * size, classes, |j| {
            if j == rank {
                peers.clone()
            } else if j < size {
                vec![j]
            } else if (j - size) % size != rank {
                vec![(j - size) % size]
            } else {
                Vec::new()
            }
        })
    }

    /// The buffers of a rank in a ring with `wires` wires per neighbour. Per (class, slot)
    /// tile: send buffers, then receive buffers, each indexed by direction * wires + wire.
    pub(crate) fn ring(wires: usize, classes: SizeClasses) -> BufferPlan {
        BufferPlan::tiled(Shape::Ring { wires }, 4 * wires, classes, |j| {
            let recv = j >= 2 * wires;
            let (dir, wire) = ((j % (2 * wires)) / wires, j % wires);
            // Direction 0 sends right and receives left; direction 1 the reverse.
            match (dir, recv) {
                (0, false) | (1, true) => vec![wires + wire],
                _ => vec![wire],
            }
        })
    }

    /// A tile of `tile` buffers per class and pipeline slot, in that order; buffer `j` of a
    /// tile of a used class reaches the connections `conns(j)`, and of an unused one none.
    fn tiled(
        shape: Shape,
        tile: usize,
        classes: SizeClasses,
        conns: impl Fn(usize) -> Vec<usize>,
    ) -> BufferPlan {
        let used: Vec<Class> = classes.used().collect();
        let mut buffers = Vec::with_capacity(CLASSES * PIPELINE * tile);
        for k in 0..CLASSES {
            let class = Class(k as u8);
            let on = used.contains(&class);
            for _slot in 0..PIPELINE {
                buffers.extend((0..tile).map(|j| BufferSpec {
                    bytes: class.bytes(),
                    conns: if on { conns(j) } else { Vec::new() },
                }));
            }
        }
        BufferPlan {
            shape,
            tile,
            buffers,
        }
    }

    fn base(&self, class: Class, slot: usize) -> usize {
        debug_assert!(slot < PIPELINE);
        (class.index() * PIPELINE + slot) * self.tile
    }

    fn mesh_size(&self) -> usize {
        match self.shape {
            Shape::Mesh { size, .. } => size,
            Shape::Ring { .. } => panic!("a mesh buffer asked of a ring's plan"),
        }
    }

    fn wires(&self) -> usize {
        match self.shape {
            Shape::Ring { wires } => wires,
            Shape::Mesh { .. } => panic!("a ring buffer asked of a mesh's plan"),
        }
    }

    /// Mesh: this rank's send buffer (posted to every peer).
    pub(crate) fn mesh_send(&self, class: Class, slot: usize) -> BufId {
        let rank = match self.shape {
            Shape::Mesh { rank, .. } => rank,
            Shape::Ring { .. } => panic!("a mesh buffer asked of a ring's plan"),
        };
        BufId((self.base(class, slot) + rank) as u32)
    }

    /// Mesh: the buffer receiving from rank `peer`.
    pub(crate) fn mesh_recv(&self, class: Class, slot: usize, peer: usize) -> BufId {
        let _ = self.mesh_size();
        BufId((self.base(class, slot) + peer) as u32)
    }

    /// Mesh: the scatter buffer sending to rank `peer`.
    pub(crate) fn scatter_send(&self, class: Class, slot: usize, peer: usize) -> BufId {
        let size = self.mesh_size();
        BufId((self.base(class, slot) + size + peer) as u32)
    }

    /// Mesh: the scatter buffer receiving from rank `peer`.
    pub(crate) fn scatter_recv(&self, class: Class, slot: usize, peer: usize) -> BufId {
        let size = self.mesh_size();
        BufId((self.base(class, slot) + 2 * size + peer) as u32)
    }

    /// Ring: the send buffer of direction `dir` on wire `wire`.
    pub(crate) fn ring_send(&self, class: Class, slot: usize, dir: usize, wire: usize) -> BufId {
        let wires = self.wires();
        BufId((self.base(class, slot) + dir * wires + wire) as u32)
    }

    /// Ring: the receive buffer of direction `dir` on wire `wire`.
    pub(crate) fn ring_recv(&self, class: Class, slot: usize, dir: usize, wire: usize) -> BufId {
        let wires = self.wires();
        BufId((self.base(class, slot) + 2 * wires + dir * wires + wire) as u32)
    }

    /// The buffer `id`.
    #[cfg(test)]
    pub(crate) fn spec(&self, id: BufId) -> &BufferSpec {
        &self.buffers[id.0 as usize]
    }

    /// How many memory regions each of `conns` connections registers.
    #[cfg(test)]
    pub(crate) fn regions_per_connection(&self, conns: usize) -> Vec<usize> {
        let mut counts = vec![0; conns];
        for spec in &self.buffers {
            for &c in &spec.conns {
                counts[c] += 1;
            }
        }
        counts
    }

    /// Bytes of memory the used buffers take.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.buffers
            .iter()
            .filter(|s| !s.conns.is_empty())
            .map(|s| s.bytes)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_buffers_follow_mlx_layout_and_registrations() {
        let (rank, size) = (1, 3);
        let plan = BufferPlan::mesh(rank, size, SizeClasses::Large);
        assert_eq!(plan.buffers.len(), 8 * 2 * 9);
        // MLX: mesh buffer k*2*P + b*P + j; scatter k*2*2P + b*2P + j (two separate vectors).
        let c3 = Class(3);
        assert_eq!(plan.spec(plan.mesh_send(c3, 1)).conns, vec![0, 2]);
        assert_eq!(plan.spec(plan.mesh_recv(c3, 1, 2)).conns, vec![2]);
        assert_eq!(plan.spec(plan.scatter_send(c3, 0, 0)).conns, vec![0]);
        assert_eq!(plan.spec(plan.scatter_recv(c3, 0, 2)).conns, vec![2]);
        assert!(plan.spec(plan.scatter_send(c3, 0, rank)).conns.is_empty());
        assert!(plan.spec(plan.scatter_recv(c3, 0, rank)).conns.is_empty());
        for k in 0..8u8 {
            for slot in 0..2 {
                let spec = plan.spec(plan.mesh_send(Class(k), slot));
                assert_eq!(spec.bytes, Class(k).bytes());
            }
        }
        // 16 + 16 + 16 + 16 regions per peer connection; none on our own number.
        assert_eq!(plan.regions_per_connection(3), vec![64, 0, 64]);
        // Every id is distinct.
        let mut ids = Vec::new();
        for k in 0..8u8 {
            for slot in 0..2 {
                ids.push(plan.mesh_send(Class(k), slot));
                for p in 0..size {
                    if p != rank {
                        ids.push(plan.mesh_recv(Class(k), slot, p));
                    }
                    ids.push(plan.scatter_send(Class(k), slot, p));
                    ids.push(plan.scatter_recv(Class(k), slot, p));
                }
            }
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }

    #[test]
    fn ring_buffers_follow_mlx_directions() {
        let wires = 2;
        let plan = BufferPlan::ring(wires, SizeClasses::Large);
        assert_eq!(plan.buffers.len(), 8 * 2 * 8);
        let c = Class(5);
        // Direction 0 sends on right[w] (connection 2 + w) and receives on left[w].
        assert_eq!(plan.spec(plan.ring_send(c, 0, 0, 1)).conns, vec![3]);
        assert_eq!(plan.spec(plan.ring_recv(c, 0, 0, 1)).conns, vec![1]);
        assert_eq!(plan.spec(plan.ring_send(c, 1, 1, 0)).conns, vec![0]);
        assert_eq!(plan.spec(plan.ring_recv(c, 1, 1, 0)).conns, vec![2]);
        assert_eq!(plan.regions_per_connection(4), vec![32; 4]);
    }

    #[test]
    fn macos_26_2_registers_only_4_kib_buffers() {
        let plan = BufferPlan::mesh(0, 4, SizeClasses::Small);
        assert_eq!(plan.regions_per_connection(4), vec![0, 8, 8, 8]);
        assert!(plan.spec(plan.mesh_send(Class(1), 0)).conns.is_empty());
        // Mesh: 2 slots x (P + 2P - 2 used) buffers of 4 KiB.
        assert_eq!(plan.bytes(), 2 * (4 + 6) * 4096);
        let ring = BufferPlan::ring(1, SizeClasses::Small);
        assert_eq!(ring.regions_per_connection(2), vec![4, 4]);
    }

    #[test]
    fn memory_is_about_6p_mib_for_a_mesh() {
        let plan = BufferPlan::mesh(0, 8, SizeClasses::Large);
        // Per class and slot: P mesh + 2(P-1) scatter buffers are used.
        let per_class_slot = 8 + 14;
        let all_classes: usize = (0..8).map(|k| 4096usize << k).sum();
        assert_eq!(plan.bytes(), 2 * per_class_slot * all_classes);
    }
}
