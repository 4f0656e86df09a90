#!/usr/bin/env bash
# Every check and test of the workspace, after installing what the tests need.
#
#   tools/test.sh            checks, then tests (estimated 20-25 minutes on 2 idle cores from
#                            a clean clone; most of it is compiling)
#
# What it runs, and why twice where it does:
# - formatting; the SAFETY.md ledger against ffi's unsafe sites (tools/check-safety.sh);
# - clippy and rustdoc: clippy with default features and with all features, since each
#   compiles code the other does not (`cfg(not(feature = ...))` stubs, the jaccl and probes
#   modules);
# - the MSRV (Cargo.toml's rust-version): the library checked with that exact toolchain,
#   installed through rustup (see that step for what happens when it cannot be);
# - the unit tests, with the simulations that live in the library, in a debug build, with
#   default and with all features: only there do the `debug_assert!`s (the Group contract's
#   among them) execute;
# - the whole suite, release, all features; then, with default features, the release
#   integration tests whose code the features change (the ring's collectives, where the
#   probes compile in or out, and the README example);
# - the tests that need root: network namespaces, and the probes under bpftrace; between
#   them a short chaos run (tools/chaos.sh 5: faults injected into rings, blame checked);
# - a short fuzz run of every target (tools/fuzz.sh, which installs cargo-fuzz if missing).
# Each step prints its time; the last lines sum them up.
#
# What it installs when missing: the Python venv with MLX's CPU build that the interop
# tests run MLX ranks in (tools/mlx-venv.sh; it needs python3 with venv and pip, and network
# access to PyPI the first time), and on Linux rdma-core's verbs header (libibverbs-dev,
# through apt-get) for the verbs layout test.
set -euo pipefail
cd "$(dirname "$0")/.."

timings=(); current=""; started=$SECONDS; last=$SECONDS
# Prints a step's header, and the time the previous step took.
step() {
  if [ -n "$current" ]; then
    timings+=("$(printf '%5ds  %s' $((SECONDS - last)) "$current")")
    printf '    (%ds)\n' $((SECONDS - last))
  fi
  current=$*; last=$SECONDS
  printf '\n==> %s\n' "$*"
}

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

step "SAFETY.md lists every unsafe site of ffi/"
tools/check-safety.sh

# clippy's incompatible_msrv lint (on by default) also holds std API use to rust-version.
step "lints, all features"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "lints, default features"
cargo clippy --workspace --all-targets -- -D warnings

step "docs, all features and default features"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

msrv=$(sed -n 's/^rust-version = "\([0-9.]*\)"$/\1/p' Cargo.toml)
[[ "$msrv" =~ ^[0-9]+\.[0-9]+$ ]] && msrv=$msrv.0
step "MSRV: the library with Rust $msrv"
if rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1; then
  # The library and ffi with either feature set, against the committed Cargo.lock (so a
  # dependency that needs a newer compiler fails here too). Tests, benches and tools are
  # built with the current toolchain only.
  cargo "+$msrv" check -p nuvec-distributed --lib --all-features
  cargo "+$msrv" check -p nuvec-distributed --lib
else
  # Do not pretend: without that toolchain only clippy's incompatible_msrv (lints steps)
  # checked anything, and it sees std APIs newer than the MSRV, not language features,
  # lints or dependencies that need a newer compiler.
  echo "NOT CHECKED: rustup cannot install Rust $msrv here; only clippy's incompatible_msrv held the code to it"
fi

step "unit tests, debug build (debug assertions on): default features, then all features"
cargo test -p nuvec-distributed -p nuvec-distributed-ffi --lib
cargo test -p nuvec-distributed -p nuvec-distributed-ffi --lib --all-features

step "tests, all features (release): the whole suite"
cargo test --workspace --all-features --release

# The integration tests are the same with default features except where the features change
# the library under them: the ring's collectives (probes compiled out) and the README
# example. jaccl.rs and probes.rs exist only with their features; the unit tests of the
# default build ran above.
step "tests, default features (release): the ring and the example"
cargo test --release --test ring --test example

step "network-namespace test (optional: needs root and ip netns)"
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add nuvec-probe-$$ 2>/dev/null; then
  ip netns del nuvec-probe-$$
  cargo test --release --test netns -- --ignored
else
  echo "NOT RUN: tests/netns.rs needs root and a working 'ip netns' (iproute2); this machine has neither or refuses"
fi

# Rings of 3 to 5 ranks, one rank killed, stopped, cut off or late per round; every survivor
# must name it in time. As root the cut-link faults run too (network namespaces), else the
# run says they were skipped. About 5 s a round.
step "chaos run, 5 rounds (tools/chaos.sh 5)"
tools/chaos.sh 5

step "probes under bpftrace (needs root and bpftrace; fails if they cannot attach)"
if [ "$(id -u)" = 0 ] && command -v bpftrace >/dev/null; then
  cargo test --release --all-features --test probes -- --ignored
else
  echo "NOT RUN: tests/probes.rs's bpftrace test needs root and bpftrace; this machine has not both"
fi

step "fuzz smoke run (15 s per target)"
tools/fuzz.sh --seconds 15

step "all checks passed"
printf '%s\n' "${timings[@]}"
printf '%5ds  in all\n' $((SECONDS - started))
