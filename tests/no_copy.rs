//! The adapter between nuvec-core and the engine copies nothing and allocates nothing: it
//! hands the engine the very buffers nuvec-core hands it.
//!
//! Two proofs. A recording engine [`Communicator`] (no network) sees, for every call of
//! the adapter ([`nuvec_distributed::communicator`]), the address and length of the
//! caller's own buffer, and the calls through it allocate nothing. Then real groups of two
//! ranks (a thread each, on loopback: MLX's wire, the native wire over shared memory and
//! over TCP) run every collective of the adapter with no heap allocation once warm, counted
//! by `ffi`'s counting allocator, installed in this test binary; it counts the calling
//! thread's allocations, and a collective runs on the thread that calls it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ffi::alloc::CountingAllocator;
use nuvec_core::DType;
use nuvec_core::distributed::AllReduce;
use nuvec_distributed::engine::{self, Communicator, ReduceOp, Transport};
use nuvec_distributed::{Backend, Options};
use nuvec_tools::testing;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// What the engine was handed last: the call, the buffer's address and length (for
/// `all_gather`, the output's; the input's in `input_addr`). Atomics, so recording
/// allocates nothing.
#[derive(Debug, Default)]
struct Recorder {
    calls: AtomicUsize,
    addr: AtomicUsize,
    len: AtomicUsize,
    input_addr: AtomicUsize,
}

impl Recorder {
    fn record(&self, addr: usize, len: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.addr.store(addr, Ordering::Relaxed);
        self.len.store(len, Ordering::Relaxed);
    }

    /// The calls so far, and the last call's buffer.
    fn last(&self) -> (usize, usize, usize) {
        (
            self.calls.load(Ordering::Relaxed),
            self.addr.load(Ordering::Relaxed),
            self.len.load(Ordering::Relaxed),
        )
    }
}

/// Rank 0 of two, whose transport records what it is handed and moves nothing.
impl Communicator for Recorder {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        2
    }
    fn backend(&self) -> &'static str {
        "recorder"
    }
    fn all_reduce(&self, _: ReduceOp, _: engine::DType, data: &mut [u8]) -> engine::Result<()> {
        self.record(data.as_ptr().addr(), data.len());
        Ok(())
    }
    fn all_gather(&self, input: &[u8], output: &mut [u8]) -> engine::Result<()> {
        self.input_addr
            .store(input.as_ptr().addr(), Ordering::Relaxed);
        self.record(output.as_ptr().addr(), output.len());
        Ok(())
    }
    fn sum_scatter(&self, _: engine::DType, _: &[u8], output: &mut [u8]) -> engine::Result<()> {
        self.record(output.as_ptr().addr(), output.len());
        Ok(())
    }
    fn send(&self, data: &[u8], _: usize) -> engine::Result<()> {
        self.record(data.as_ptr().addr(), data.len());
        Ok(())
    }
    fn recv(&self, data: &mut [u8], _: usize) -> engine::Result<()> {
        self.record(data.as_ptr().addr(), data.len());
        Ok(())
    }
    fn barrier(&self) -> engine::Result<()> {
        Ok(())
    }
    fn health(&self) -> engine::Result<()> {
        Ok(())
    }
    fn close(&self) -> engine::Result<()> {
        Ok(())
    }
}

/// Every nuvec dtype the engine reduces.
const DTYPES: [DType; 14] = {
    use DType::*;
    [
        Bool, U8, U16, U32, U64, I8, I16, I32, I64, F16, BF16, F32, F64, Complex64,
    ]
};

#[test]
fn the_adapter_hands_the_engine_the_callers_own_buffers() {
    let recorder = Arc::new(Recorder::default());
    let comm = nuvec_distributed::communicator(engine::Group::new(recorder.clone()));
    let mut calls = 0;
    for dtype in DTYPES {
        for op in [AllReduce::Sum, AllReduce::Max, AllReduce::Min] {
            let mut data = vec![0u8; 24 * dtype.size()];
            comm.all_reduce(op, dtype, &mut data).unwrap();
            calls += 1;
            assert_eq!(
                recorder.last(),
                (calls, data.as_ptr().addr(), data.len()),
                "{op:?} {dtype:?}: the engine got another buffer than the caller's"
            );
        }
    }

    let input = vec![1u8; 40];
    let mut output = vec![0u8; 80];
    comm.all_gather(&input, &mut output).unwrap();
    calls += 1;
    assert_eq!(
        recorder.last(),
        (calls, output.as_ptr().addr(), output.len())
    );
    assert_eq!(
        recorder.input_addr.load(Ordering::Relaxed),
        input.as_ptr().addr()
    );

    let message = vec![2u8; 33];
    comm.send(1, &message).unwrap();
    calls += 1;
    assert_eq!(
        recorder.last(),
        (calls, message.as_ptr().addr(), message.len())
    );
    let mut received = vec![0u8; 33];
    comm.recv(1, &mut received).unwrap();
    calls += 1;
    assert_eq!(
        recorder.last(),
        (calls, received.as_ptr().addr(), received.len())
    );
}

#[test]
fn the_adapter_allocates_nothing_per_call() {
    let recorder = Arc::new(Recorder::default());
    let comm = nuvec_distributed::communicator(engine::Group::new(recorder));
    let mut data = vec![0u8; 4096];
    let input = vec![0u8; 2048];
    let mut output = vec![0u8; 4096];
    let made = testing::steady_allocations(100, || {
        for dtype in DTYPES {
            comm.all_reduce(AllReduce::Sum, dtype, &mut data).unwrap();
        }
        comm.all_gather(&input, &mut output).unwrap();
        comm.send(1, &input).unwrap();
        comm.recv(1, &mut output).unwrap();
    });
    assert_eq!(
        made, 0,
        "100 rounds through the adapter allocated {made} times"
    );
}

/// Two ranks in threads form a group with `options`; each checks that its link is
/// `transport`, then counts its thread's allocations over 20 rounds of every collective of the
/// adapter, after one round to warm up (buffers allocated outside the count).
fn allocations_on_a_real_group(options: Options, transport: Transport) {
    let nodes = testing::loopback_nodes(&testing::free_ports(2, 1));
    let options = options.timeout(Duration::from_secs(20));
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                let (nodes, options) = (&nodes, &options);
                s.spawn(move || {
                    let group = engine::init_with(nodes, rank, options).unwrap();
                    assert_eq!(group.transport(1 - rank).unwrap(), transport);
                    let comm = nuvec_distributed::communicator(group);
                    for elems in [1, 1000, 300_000] {
                        let mut f32s = vec![0u8; 4 * elems];
                        let mut halves = vec![0u8; 2 * elems];
                        let mut i32s = vec![0u8; 4 * elems];
                        let mut bools = vec![1u8; elems];
                        let mut gathered = vec![0u8; 8 * elems];
                        let peer = 1 - rank;
                        let made = testing::steady_allocations(20, || {
                            let c = comm.as_ref();
                            c.all_reduce(AllReduce::Sum, DType::F32, &mut f32s).unwrap();
                            c.all_reduce(AllReduce::Max, DType::F16, &mut halves)
                                .unwrap();
                            c.all_reduce(AllReduce::Min, DType::BF16, &mut halves)
                                .unwrap();
                            c.all_reduce(AllReduce::Sum, DType::I32, &mut i32s).unwrap();
                            c.all_reduce(AllReduce::Sum, DType::Bool, &mut bools)
                                .unwrap();
                            c.all_gather(&f32s, &mut gathered).unwrap();
                            if rank == 0 {
                                c.send(peer, &f32s).unwrap();
                                c.recv(peer, &mut i32s).unwrap();
                            } else {
                                c.recv(peer, &mut i32s).unwrap();
                                c.send(peer, &f32s).unwrap();
                            }
                        });
                        assert_eq!(
                            made, 0,
                            "rank {rank}, {elems} elements: 20 rounds allocated {made} times"
                        );
                    }
                })
            })
            .collect();
        for rank in ranks {
            rank.join().unwrap();
        }
    });
}

#[test]
fn a_real_group_through_the_adapter_allocates_nothing_on_the_mlx_wire() {
    allocations_on_a_real_group(Options::default().backend(Backend::Ring), Transport::Tcp);
}

#[test]
fn a_real_group_through_the_adapter_allocates_nothing_over_shared_memory() {
    allocations_on_a_real_group(
        Options::default().backend(Backend::Native),
        Transport::SharedMemory,
    );
}

#[test]
fn a_real_group_through_the_adapter_allocates_nothing_over_native_tcp() {
    allocations_on_a_real_group(
        Options::default()
            .backend(Backend::Native)
            .shared_memory(false),
        Transport::Tcp,
    );
}
