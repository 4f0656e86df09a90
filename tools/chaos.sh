#!/usr/bin/env bash
# Fault injection: N rounds (default 100), each a ring of 3 to 5 local ranks running random
# collectives (4 B to 8 MiB, results checked) while one rank is killed (-9), stopped
# (SIGSTOP), cut off (its link set down between network namespaces; needs root and `ip
# netns`, skipped and said so otherwise) or late (within the timeout: all must succeed).
# Every survivor must name the faulted rank within timeout + 2 s (see tools/src/chaos.rs).
#
#   tools/chaos.sh [N] [--seed S] [--timeout SECONDS] [--steps K] [--wire mlx|native]
#                  [--recover] [--verbose]
#
# Each round prints its seed; `tools/chaos.sh 1 --seed S` replays that round. Prints the
# counts (rounds, correct verdicts, wrong blame, wrong results, late verdicts, hangs, panics)
# and exits non-zero if any round was not correct.
#
# --recover: kill and stop faults only (a cut link or a late rank leaves no process to
# restart). After the fault every survivor shrinks (Group::shrink) and verifies collectives
# of random size on the shrunk group; a stopped victim is woken and its own shrink must fail
# saying it was left out, without disturbing the shrunk group; the victim is restarted at its
# hostfile address (plain init), the survivors rejoin (Group::rejoin) and the full group
# verifies collectives. A round is correct only if every step verified; the summary counts
# wrong results, hangs, panics, failed shrinks and failed rejoins apart, and gives the median
# and max time from a failure to the first verified collective of the shrunk group.
set -euo pipefail
cd "$(dirname "$0")/.."
# NUVEC_BIN names a `nuvec` built already (tools/test.sh passes the whole suite's); without
# it the launcher is built here.
[ -n "${NUVEC_BIN:-}" ] && exec "$NUVEC_BIN" chaos "$@"
cargo build --release --quiet -p nuvec-tools --bin nuvec
exec "${CARGO_TARGET_DIR:-target}/release/nuvec" chaos "$@"
