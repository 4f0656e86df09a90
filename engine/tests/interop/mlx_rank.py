"""One MLX rank of an interop ring: runs a plan of collectives with mx.distributed.

Started by tests/interop.rs with MLX_HOSTFILE and MLX_RANK set (as mlx.launch sets them)
and NUVEC_INTEROP_PLAN naming a JSON plan:

    {"dir": "/tmp/...", "ops": [{"op": "all_sum", "dtype": "float32", "count": 1000}, ...]}

For op i this rank reads its input from <dir>/in-<rank>-<i>.bin (raw little-endian element
bytes) and writes what MLX computed to <out>/out-<rank>-<i>.bin, where <out> is
NUVEC_INTEROP_OUT. The Rust ranks of the same ring do the same, so the test can compare
every rank's bytes with an all-MLX ring of the same shape.
"""

import json
import os
import sys

import mlx.core as mx

from mlx_bits import load, store


def main():
    plan = json.load(open(os.environ["NUVEC_INTEROP_PLAN"]))
    out_dir = os.environ["NUVEC_INTEROP_OUT"]
    group = mx.distributed.init(strict=True, backend="ring")
    rank, size = group.rank(), group.size()
    left, right = (rank - 1) % size, (rank + 1) % size
    cpu = mx.cpu
    for i, op in enumerate(plan["ops"]):
        x = load(os.path.join(plan["dir"], f"in-{rank}-{i}.bin"), op["dtype"])
        kind = op["op"]
        if kind in ("all_sum", "all_max", "all_min"):
            y = getattr(mx.distributed, kind)(x, group=group, stream=cpu)
        elif kind == "all_gather":
            y = mx.distributed.all_gather(x, group=group, stream=cpu)
        elif kind == "sendrecv":
            # Even ranks send first, so large messages cannot deadlock.
            if rank % 2 == 0:
                mx.eval(mx.distributed.send(x, right, group=group, stream=cpu))
                y = mx.distributed.recv_like(x, left, group=group, stream=cpu)
            else:
                y = mx.distributed.recv_like(x, left, group=group, stream=cpu)
                mx.eval(y)
                mx.eval(mx.distributed.send(x, right, group=group, stream=cpu))
        else:
            sys.exit(f"unknown op {kind!r}")
        mx.eval(y)
        store(os.path.join(out_dir, f"out-{rank}-{i}.bin"), y, op["dtype"])
    print("NUVEC-RANK-DONE", flush=True)


if __name__ == "__main__":
    main()
