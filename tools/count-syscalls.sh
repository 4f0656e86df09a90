#!/usr/bin/env bash
# Counts the system calls one rank makes per collective, with perf's syscall tracepoints.
#
#   tools/count-syscalls.sh [SIZE_BYTES] [ITERS] [RANKS]      (defaults: 4 20000 2)
#
# Starts RANKS ranks of `nuvec bench` on loopback with a fixed iteration count; rank 0
# runs under `perf stat`. The same run with ITERS/10 iterations is subtracted, so setup
# and the sweep's own warm-up and barriers cancel out: what is printed is per all_sum.
# NUVEC_BIN=path/to/nuvec counts another build (e.g. a baseline) instead of building this one.
# Needs perf (Debian: linux-perf) and tracefs (mounted here if missing; root).
# The ranks inherit the environment: NUVEC_DISTRIBUTED_IO=uring counts the io_uring driver
# (with two ranks a small step is one io_uring_enter for its send and receive, plus one
# whenever a spin sees a completion waiting for task work).
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-4}; iters=${2:-20000}; ranks=${3:-2}
nuvec=${NUVEC_BIN:-target/release/nuvec}
[ -n "${NUVEC_BIN:-}" ] || cargo build -q --release -p nuvec-tools
command -v perf >/dev/null || { echo "count-syscalls: perf is missing (apt-get install linux-perf)" >&2; exit 1; }
[ -d /sys/kernel/tracing/events/raw_syscalls ] || mount -t tracefs nodev /sys/kernel/tracing
events=raw_syscalls:sys_enter,syscalls:sys_enter_write,syscalls:sys_enter_sendto,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

run() { # run N -> perf CSV of rank 0
  local n=$1 ports=() hostfile="$tmp/hostfile.json"
  ports=$(python3 -c "
import socket; s=[socket.socket() for _ in range($ranks)]
[x.bind(('127.0.0.1',0)) for x in s]; print(' '.join(str(x.getsockname()[1]) for x in s))")
  python3 -c "import json,sys; print(json.dumps([['127.0.0.1:'+p] for p in sys.argv[1:]]))" $ports > "$hostfile"
  local pids=()
  for ((r=1; r<ranks; r++)); do
    MLX_HOSTFILE=$hostfile MLX_RANK=$r "$nuvec" bench --worker --sizes "$size" --iters "$n" >/dev/null & pids+=($!)
  done
  MLX_HOSTFILE=$hostfile MLX_RANK=0 perf stat -x, -e "$events" -o "$tmp/perf-$n.csv" \
    "$nuvec" bench --worker --sizes "$size" --iters "$n" > "$tmp/out-$n.txt"
  wait "${pids[@]}"
}
run $((iters / 10)); run "$iters"
python3 - "$tmp/perf-$((iters / 10)).csv" "$tmp/perf-$iters.csv" $((iters - iters / 10)) "$size" "$ranks" <<'PY'
import sys
def load(p):
    out = {}
    for line in open(p):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[0].replace(".", "").isdigit():
            out[parts[2]] = float(parts[0])
    return out
small, big, n = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
print(f"system calls per all_sum of {sys.argv[4]} B, rank 0 of {sys.argv[5]} (perf tracepoints, {n} iterations):")
for k in big:
    name = k.split(":")[1].replace("sys_enter_", "").replace("sys_enter", "total")
    print(f"  {name:12} {(big[k] - small.get(k, 0)) / n:6.2f}")
PY
grep -E "^ +[0-9]" "$tmp/out-$iters.txt"
