#!/usr/bin/env bash
# The soak run: 100 000 4 B all_sums and 1 000 16 MiB all_sums on three local ranks, with
# resident memory and open file descriptors sampled every tenth of the way (printed per
# rank as rss_kib/fds). Fails if descriptors change or memory grows after the first tenth.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test soak -- --ignored --nocapture soak_three_ranks
