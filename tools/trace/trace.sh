#!/usr/bin/env bash
# Runs tools/trace/nuvec.bt against every process that runs BINARY (built with
# `--features probes`), or against one process with -p PID. Attaching by process is the
# reliable way: by path, bpftrace 0.17 does not always enable the probes' semaphores in
# processes that start after it.
#
#   tools/trace/trace.sh path/to/binary
#   tools/trace/trace.sh -p PID
#
# Needs root, bpftrace (Debian: apt-get install bpftrace) and tracefs (mounted if missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ -d /sys/kernel/tracing/events ] || mount -t tracefs nodev /sys/kernel/tracing
if [ "${1:-}" = -p ]; then exec bpftrace -p "$2" "$here/nuvec.bt"; fi
binary=$(realpath "$1")
# bpftrace wants the binary in each usdt probe when no process is given.
exec bpftrace -e "$(sed "s#usdt::nuvec:#usdt:$binary:nuvec:#" "$here/nuvec.bt")"
