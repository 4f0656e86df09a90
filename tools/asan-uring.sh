#!/usr/bin/env bash
# Runs the io_uring binding's tests (ffi/src/uring.rs) under AddressSanitizer, which reports
# a kernel write into a buffer the caller already freed: the buffer contract of SAFETY.md.
#
#   tools/asan-uring.sh
#
# Needs a nightly toolchain (`rustup toolchain install nightly`); skips with a message if
# there is none. Linux x86_64 only. Builds into target/asan, apart from the normal builds.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "asan-uring: no nightly toolchain; skipped (rustup toolchain install nightly)" >&2
  exit 0
fi
RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address" \
  cargo +nightly test -q --target x86_64-unknown-linux-gnu --target-dir target/asan \
  -p nuvec-distributed-ffi --lib uring
