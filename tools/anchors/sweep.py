"""The sweep methodology every Python anchor shares (mlx_bench.py, mpi_bench.py,
gloo_bench.py): the command line, the timing of one (op, size) point, and the report.

Each anchor runs as a script (`python tools/anchors/X_bench.py`), so Python puts this
folder first on sys.path and `import sweep` finds this file beside it.

For every message size an anchor builds a rank-dependent input, then `measure`:
  * warms up, then rank 0 chooses an iteration count from the warm-up time (target
    --target-time seconds, more iterations for small sizes) and shares it, so every rank
    runs the same count,
  * times each iteration alone (an untimed `prep` may run before each one),
  * verifies the result exactly (after warm-up and after the timed loop).
The reported latency is the max over ranks of each rank's median.

Conventions (as nccl-tests):
  all_sum / all_reduce : size = bytes per rank; algbw = size/t; busbw = algbw*2(n-1)/n
  all_gather           : size = bytes per rank (input); output = n*size;
                         algbw = n*size/t; busbw = algbw*(n-1)/n
  sendrecv             : ping-pong rank0 <-> rank1; lat = round-trip/2;
                         algbw = busbw = size/lat (one-way)
"""
import json
import os
import statistics
import sys
import time

SIZES = [4, 64, 1024, 8192, 65536, 1 << 20, 16 << 20, 64 << 20]


def human(nbytes):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div and nbytes % div == 0:
            return f"{nbytes // div} {unit}"
    return f"{nbytes} B"


def add_arguments(p, ops):
    """The options every anchor takes; `ops` is its default --ops list."""
    p.add_argument("--ops", default=ops)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--target-time", type=float, default=1.0,
                   help="seconds of timed iterations per (op,size)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--max-iters", type=int, default=5000)
    p.add_argument("--out", default=None, help="JSON output (rank 0)")
    p.add_argument("--label", default="")


class Collectives:
    """What `measure` needs of the framework under test: a barrier, an int shared from
    rank 0, and one float from every rank gathered on every rank."""

    def __init__(self, rank, world, barrier, bcast_int, gather_float):
        self.rank = rank
        self.world = world
        self.barrier = barrier
        self.bcast_int = bcast_int
        self.gather_float = gather_float


def expected(op, rank, world, base, x, concat):
    """The exact result of `op` on this rank when rank r's input is base + 1000 r (`x` is
    this rank's; small integers, so float32 sums are exact), or None where there is
    nothing to check (sendrecv beyond rank 1). `concat` joins a list of the framework's
    arrays."""
    if op == "sendrecv":
        return {0: x, 1: base}.get(rank)  # rank 0 gets its echo, rank 1 rank 0's buffer
    if op == "all_gather":
        return concat([base + float(1000 * r) for r in range(world)])
    return base * float(world) + float(1000 * world * (world - 1) // 2)


def _timed(step, prep, count):
    """Runs `step` `count` times, each after an untimed `prep` (when there is one);
    returns the per-call times and the last call's result."""
    times = []
    y = None
    for _ in range(count):
        if prep is not None:
            prep()
        t0 = time.perf_counter()
        y = step()
        times.append(time.perf_counter() - t0)
    return times, y


def pingpong(rank, send, recv, x, y):
    """The step of sendrecv on `rank`: rank 0 sends `x` to rank 1 and receives its echo
    in `y`, rank 1 receives into `y` and sends it back, other ranks idle. `send(buffer,
    peer)` and `recv(buffer, peer)` are the framework's blocking calls."""
    if rank == 0:
        def step():
            send(x, 1)
            recv(y, 1)
    elif rank == 1:
        def step():
            recv(y, 0)
            send(y, 0)
    else:
        def step():
            pass
    return step


def measure(op, nbytes, c, args, step, want, equal, prep=None, result=None):
    """Times `step` for one (op, size) point on every rank of `c` (a `Collectives`);
    `equal(y, want)` verifies the result (unless `want` is None): `result()`, or without
    it what `step` returned. Returns the point's record."""

    def check(y):
        return want is None or bool(equal(y if result is None else result(), want))

    c.barrier()
    n_warm = args.warmup if nbytes < (16 << 20) else max(2, args.warmup // 5)
    warm, y = _timed(step, prep, n_warm)
    ok = check(y)
    t = statistics.median(warm)
    iters = c.bcast_int(max(args.min_iters,
                            min(args.max_iters, int(args.target_time / max(t, 1e-7)))))
    c.barrier()
    times, y = _timed(step, prep, iters)
    ok = ok and check(y)
    oks = c.gather_float(1.0 if ok else 0.0)
    meds = c.gather_float(statistics.median(times))
    world = c.world
    if op == "sendrecv":
        lat = meds[0] / 2.0  # rank 0 measures the round trip
        algbw = nbytes / lat
        busbw = algbw
    elif op in ("all_sum", "all_reduce"):
        lat = max(meds)
        algbw = nbytes / lat
        busbw = algbw * 2 * (world - 1) / world
    else:  # all_gather
        lat = max(meds)
        algbw = world * nbytes / lat
        busbw = algbw * (world - 1) / world
    ts = sorted(times)
    return {
        "op": op,
        "bytes": nbytes,
        "iters": iters,
        "lat_us": lat * 1e6,
        "rank0_med_us": meds[0] * 1e6 / (2.0 if op == "sendrecv" else 1.0),
        "rank0_p10_us": ts[int(0.1 * (len(ts) - 1))] * 1e6,
        "rank0_p90_us": ts[int(0.9 * (len(ts) - 1))] * 1e6,
        "algbw_Bps": algbw,
        "busbw_Bps": busbw,
        "correct": all(v == 1.0 for v in oks),
    }


def run_all(args, c, run_op):
    """Runs `run_op(op, nbytes)` over every --ops and --sizes on the ranks of `c` (a
    `Collectives`), but sendrecv on one rank; rank 0 prints each point."""
    results = []
    for op in args.ops.split(","):
        if op == "sendrecv" and c.world < 2:
            continue
        for nbytes in [int(s) for s in args.sizes.split(",")]:
            r = run_op(op, nbytes)
            results.append(r)
            if c.rank == 0:
                print(
                    f"{op:10s} {human(nbytes):>8s} iters={r['iters']:5d} "
                    f"lat={r['lat_us']:12.1f}us algbw={r['algbw_Bps']/1e9:8.3f}GB/s "
                    f"busbw={r['busbw_Bps']/1e9:8.3f}GB/s ok={r['correct']}",
                    flush=True,
                )
    return results


def write_out(path, meta):
    """Writes `meta` as JSON to `path` (--out), when one is given."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(meta, f, indent=1)


def all_correct(results):
    """Whether every point verified; says so on stderr when one did not."""
    if all(r["correct"] for r in results):
        return True
    print("CORRECTNESS FAILURE", file=sys.stderr)
    return False
