#!/usr/bin/env bash
# Runs every fuzz target; fails if a target crashes.
#
#   tools/fuzz.sh [RUNS] [TARGET...]          RUNS executions per target (default 1 000 000),
#                                             adding what it finds to fuzz/corpus/
#   tools/fuzz.sh --seconds N [TARGET...]     N seconds per target, starting from the corpus
#                                             and seeds but leaving them as they are
#                                             (tools/test.sh's smoke run)
#
# Installs cargo-fuzz when missing (`cargo install --locked`, from crates.io). cargo-fuzz
# builds with AddressSanitizer through `-Zsanitizer`, a nightly flag; our machines have one
# stable toolchain and cannot fetch another, so this runs it with RUSTC_BOOTSTRAP=1, which
# lets a stable compiler take unstable flags (stable's rust-std ships the ASan runtime on
# x86_64 Linux). `cargo test` replays the committed seeds and corpus (tests/fuzz_corpus.rs)
# without any of this.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
smoke=false
# The smoke run builds without AddressSanitizer (`-s none`): it checks that every target
# builds and runs its corpus and a few seconds of new inputs without a panic. The parsers it
# fuzzes are safe code; the one unsafe code a target reaches is ffi's reduction kernels
# (native_header folds what it decodes), which only full runs check under the sanitizer.
# Building with it took about 106 s of the step's 151 s, without it about 70. It also builds
# unoptimised (`--dev`, which keeps debug assertions and overflow checks on): from a cold
# target directory on 2 vCPUs 59 s against 88 s optimised, and a few seconds per target
# are a smoke run at either speed.
if [ "${1:-}" = --seconds ]; then
  limit=(-max_total_time="${2:?--seconds needs a number}"); what="${2} s"; smoke=true; shift 2
  build=(-s none --dev)
else
  limit=(-runs="${1:-1000000}"); what="${1:-1000000} runs"; shift || true
  build=()
fi
targets=("$@"); [ ${#targets[@]} -gt 0 ] || targets=(hostfile handshake jaccl_side_channel native_hello native_header)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
log=$(mktemp); scratch=$(mktemp -d); trap 'rm -rf "$log" "$scratch"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  # libFuzzer adds new inputs to the first corpus directory only.
  dirs=("corpus/$t" "seeds/$t")
  $smoke && { mkdir -p "$scratch/$t"; dirs=("$scratch/$t" "${dirs[@]}"); }
  echo "== $t: $what"
  status=0
  cargo fuzz run "${build[@]}" "$t" "${dirs[@]}" -- "${limit[@]}" -max_len=2048 >"$log" 2>&1 || status=$?
  grep -E "^#[0-9]+ +DONE|^Done" "$log" || true
  if [ "$status" -ne 0 ]; then
    # A crash, a leak or a build failure: libFuzzer's report is at the end of its output.
    tail -n 60 "$log"
    echo "FAILED: fuzz target $t (exit $status)" >&2
    exit "$status"
  fi
done
