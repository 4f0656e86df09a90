#!/usr/bin/env bash
# Runs every fuzz target for RUNS executions (default 1 000 000), growing fuzz/corpus/.
#
#   tools/fuzz.sh [RUNS] [TARGET...]
#
# Installs cargo-fuzz when missing. Uses the nightly toolchain with AddressSanitizer when
# one is installed, else stable without a sanitizer (`-s none`). `cargo test` replays the
# committed seeds and corpus (tests/fuzz_corpus.rs) without any of this.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
runs=${1:-1000000}; shift || true
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(hostfile handshake)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
if rustup toolchain list 2>/dev/null | grep -q nightly; then fuzz=(cargo +nightly fuzz run); else fuzz=(cargo fuzz run -s none); fi
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  echo "== $t: $runs runs"
  "${fuzz[@]}" "$t" "corpus/$t" "seeds/$t" -- -runs="$runs" -max_len=2048 2>&1 | grep -E "^#[0-9]+ +DONE|^Done|ERROR|panicked" || true
done
