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
import numpy as np

# dtype name -> (MLX dtype, unsigned numpy type of the same width). Every array goes
# through its raw bits both ways, so NaN payloads and signed zeros reach MLX untouched
# (numpy float64 would otherwise be converted to MLX's default float32).
DTYPES = {
    "bool": (mx.bool_, np.bool_),
    "uint8": (mx.uint8, np.uint8),
    "uint16": (mx.uint16, np.uint16),
    "uint32": (mx.uint32, np.uint32),
    "uint64": (mx.uint64, np.uint64),
    "int8": (mx.int8, np.uint8),
    "int16": (mx.int16, np.uint16),
    "int32": (mx.int32, np.uint32),
    "int64": (mx.int64, np.uint64),
    "float16": (mx.float16, np.uint16),
    "bfloat16": (mx.bfloat16, np.uint16),
    "float32": (mx.float32, np.uint32),
    "float64": (mx.float64, np.uint64),
    "complex64": (mx.complex64, np.uint64),
}
BITS = {np.bool_: mx.bool_, np.uint8: mx.uint8, np.uint16: mx.uint16, np.uint32: mx.uint32, np.uint64: mx.uint64}


def load(path, dtype):
    mx_dtype, np_bits = DTYPES[dtype]
    host = np.fromfile(path, dtype=np.uint8).view(np_bits)
    arr = mx.array(host, dtype=BITS[np_bits])
    return arr if mx_dtype == BITS[np_bits] else arr.view(mx_dtype)


def store(path, arr, dtype):
    _, np_bits = DTYPES[dtype]
    if arr.dtype != BITS[np_bits]:
        arr = arr.view(BITS[np_bits])
    np.asarray(arr).tofile(path)


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
