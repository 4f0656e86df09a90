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
# The verbs layout test compiles a C probe against rdma-core's header; it fails (rather than
# skips) without it. On macOS it uses the SDK's header instead.
if [[ "$(uname -s)" == Linux && ! -f /usr/include/infiniband/verbs.h ]]; then
    sudo_cmd=()
    [[ "$(id -u)" -ne 0 ]] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    "${sudo_cmd[@]}" apt-get install -y -qq libibverbs-dev
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

step "all checks passed"
