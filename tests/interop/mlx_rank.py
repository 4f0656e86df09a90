"""One MLX rank of tests/interop.rs's rings, beside Rust ranks that use nuvec arrays.

Started with MLX_HOSTFILE and MLX_RANK set (as mlx.launch sets them), NUVEC_TEST_MARKERS
naming a directory shared with the other ranks, and NUVEC_INTEROP_OUT a directory for this
rank's outputs. Then either:

- NUVEC_INTEROP_PLAN names a JSON plan of collectives:

      {"dir": "/tmp/...", "ops": [{"op": "all_sum", "dtype": "float32", "shape": [3, 5],
                                   "transpose": false}, ...]}

  For op i this rank reads <dir>/in-<rank>-<i>.bin (the raw little-endian bits of the
  stored array, row-major; its shape is the op's, reversed when "transpose" is set, and the
  collective then runs on its transpose), and writes the result's bits, row-major, to
  <out>/out-<rank>-<i>.bin; at the end every result's shape to <out>/shapes-<rank>.json.
- NUVEC_INTEROP_EXCHANGE names a send/recv exchange with the nuvec rank of a ring of two
  (see `exchange` below and tests/interop.rs's `Exchange`).

Prints NUVEC-RANK-DONE when it is done.
"""

import json
import os
import sys
import time

import mlx.core as mx

# The raw-bits load and store are the engine's interop ranks' (engine/tests/interop/).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "engine", "tests", "interop"))
from mlx_bits import load, store  # noqa: E402

SENT = 64  # elements of the array an exchange sends (tests/interop.rs's SENT)


def mark(what):
    rank = os.environ["MLX_RANK"]
    open(os.path.join(os.environ["NUVEC_TEST_MARKERS"], f"{rank}-{what}"), "w").close()


def wait_for_mark(rank, what):
    path = os.path.join(os.environ["NUVEC_TEST_MARKERS"], f"{rank}-{what}")
    until = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > until:
            sys.exit(f"rank {rank} never marked {what!r}")
        time.sleep(0.01)


def run_plan(group, out_dir):
    plan = json.load(open(os.environ["NUVEC_INTEROP_PLAN"]))
    rank = group.rank()
    cpu = mx.cpu
    shapes = []
    for i, op in enumerate(plan["ops"]):
        shape = op["shape"][::-1] if op["transpose"] else op["shape"]
        x = load(os.path.join(plan["dir"], f"in-{rank}-{i}.bin"), op["dtype"], shape)
        if op["transpose"]:
            x = x.T
        kind = op["op"]
        if kind not in ("all_sum", "all_max", "all_min", "all_gather"):
            sys.exit(f"unknown op {kind!r}")
        y = getattr(mx.distributed, kind)(x, group=group, stream=cpu)
        mx.eval(y)
        store(os.path.join(out_dir, f"out-{rank}-{i}.bin"), y, op["dtype"])
        shapes.append(list(y.shape))
    with open(os.path.join(out_dir, f"shapes-{rank}.json"), "w") as f:
        json.dump(shapes, f)


def exchange(group, how, out_dir):
    """This rank's side of an exchange with the nuvec rank, its only peer."""
    peer = 1 - group.rank()
    cpu = mx.cpu
    if how == "nuvec_sends":
        # Receive a float32 array of SENT elements, keep what came, and send it back.
        y = mx.distributed.recv_like(mx.zeros((SENT,), mx.float32), peer, group=group, stream=cpu)
        mx.eval(y)
        store(os.path.join(out_dir, "mlx-received.bin"), y, "float32")
        mx.eval(mx.distributed.send(y, peer, group=group, stream=cpu))
    elif how == "mlx_sends_float32":
        x = mx.arange(1, SENT + 1, dtype=mx.float32)
        mx.eval(mx.distributed.send(x, peer, group=group, stream=cpu))
    elif how == "mlx_sends_int32_zeros":
        x = mx.zeros((SENT,), mx.int32)
        mx.eval(mx.distributed.send(x, peer, group=group, stream=cpu))
    else:
        sys.exit(f"unknown exchange {how!r}")
    # Stay connected until the nuvec rank has seen its receive end, so that what it sees is
    # the exchange's outcome and not this process leaving.
    wait_for_mark(peer, "done")


def main():
    out_dir = os.environ["NUVEC_INTEROP_OUT"]
    mark("ready")
    group = mx.distributed.init(strict=True, backend="ring")
    how = os.environ.get("NUVEC_INTEROP_EXCHANGE")
    if how:
        exchange(group, how, out_dir)
    else:
        run_plan(group, out_dir)
    print("NUVEC-RANK-DONE", flush=True)


if __name__ == "__main__":
    main()
