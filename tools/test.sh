#!/usr/bin/env bash
# Every check and test of the workspace, after installing what the tests need.
#
#   tools/test.sh            build checks, then all tests (release build, a few minutes)
#
# What it installs when missing: the Python venv with MLX's CPU build that the interop
# tests run MLX ranks in (tools/mlx-venv.sh; it needs python3 with venv and pip, and network
# access to PyPI the first time), and on Linux rdma-core's verbs header (libibverbs-dev,
# through apt-get) for the verbs layout test.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "installing test dependencies"
python=$(tools/mlx-venv.sh)
# What the Linux tests need from Debian: readelf (the probes test reads the binary's SDT
# notes), bpftrace (as root it attaches to a rank), iproute2 (`ip netns` for the namespace
# test, as root), and rdma-core's verbs.h (the verbs layout test compiles a C probe against
# it and fails, rather than skips, without it; on macOS it uses the SDK's header).
if [[ "$(uname -s)" == Linux ]]; then
  need=()
  command -v readelf >/dev/null || need+=(binutils)
  command -v bpftrace >/dev/null || need+=(bpftrace)
  command -v ip >/dev/null || need+=(iproute2)
  [[ -f /usr/include/infiniband/verbs.h ]] || need+=(libibverbs-dev)
  if [ ${#need[@]} -gt 0 ]; then
    sudo_cmd=()
    [[ "$(id -u)" -ne 0 ]] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${need[@]}"
  fi
fi
"$python" -c 'import mlx.core as mx; print("MLX", mx.__version__, "at", mx.__file__)'

step "formatting"
cargo fmt --all -- --check

step "lints"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features

step "tests"
cargo test --workspace --all-features --release

step "network-namespace test (optional: needs root and ip netns)"
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add nuvec-probe-$$ 2>/dev/null; then
  ip netns del nuvec-probe-$$
  cargo test --release --test netns -- --ignored
else
  echo "NOT RUN: tests/netns.rs needs root and a working 'ip netns' (iproute2); this machine has neither or refuses"
fi

step "all checks passed"
