#!/usr/bin/env bash
# Every check and test of the workspace, after installing what the tests need.
#
#   tools/test.sh            checks, then tests (35 minutes on 2 idle vCPUs from a clean
#                            clone; most of it is compiling)
#
# What it runs, and why twice where it does:
# - formatting; the SAFETY.md ledger against ffi's unsafe sites (tools/check-safety.sh);
# - clippy and rustdoc: clippy with default features and with all features, since each
#   compiles code the other does not (`cfg(not(feature = ...))` stubs, the jaccl and probes
#   modules);
# - the MSRV (Cargo.toml's rust-version): the library checked with that exact toolchain,
#   installed through rustup (see that step for what happens when it cannot be);
# - the unit tests, with the simulations that live in the library, all features, in the dev
#   profile (at opt-level 1): only there do the `debug_assert!`s (the Group contract's among
#   them) and the overflow checks execute;
# - the whole suite, release, all features; then, with default features, the release
#   integration tests whose code the features change (the ring's collectives, where the
#   probes compile in or out, and the README example); the whole suite includes the crate
#   documentation's first example (examples/seed.rs) under `nuvec launch -n 2` and `-n 4`;
# - a nuvec user's project with this crate patched in (tests/dropin), built in its own
#   target directory and run under `nuvec launch` on both wires;
# - the tests that need root: network namespaces, and the probes under bpftrace; between
#   them a short chaos run (tools/chaos.sh 5: faults injected into rings, blame checked; with
#   --recover: the survivors shrink, the victim restarts and rejoins, every step verified);
# - a short fuzz run of every target (tools/fuzz.sh, which installs cargo-fuzz if missing);
# - other targets (functions `cross_*` below): on x86-64, a subset of the multi-process
#   ring tests with the SIMD level forced to AVX2 and to scalar (the property tests already
#   run every level the CPU has); on an x86-64 Linux host, aarch64 Linux built with Debian's
#   cross gcc and run under qemu-user (unit tests with the simulations, at NUVEC_SIM_CASES
#   cases, and the property tests; a subset of the multi-process ring tests; the kernels
#   again on each further CPU model of NUVEC_QEMU_CPUS), clippy for aarch64 Linux and
#   macOS (the probes feature excluded: see cross_clippy), and macOS compiled and linked
#   with cargo-zigbuild, its binaries' imports checked (cross_macos_link). Measured on 2
#   idle cores with a warm target directory: 641 s in all, of which the forced levels
#   21 s, aarch64 under qemu 116 s (unit tests 56, ring subset 58, second CPU 2), cross
#   lints 9 s; the macOS link step, measured apart on 2 shared cores from a cold target
#   directory (the venv's download included), 167 s.
# On macOS (.github/workflows/ci.yml) the same script runs natively: nothing from apt, the
# Linux-only steps print why they are skipped, and the cross steps are replaced by the
# native build. That path has not yet run on a Mac: it was written by reading what each
# step needs.
# Each step prints its time; the last lines sum them up.
#
# What it installs when missing: the Python venv with MLX's CPU build that the interop
# tests run MLX ranks in (tools/mlx-venv.sh; it needs python3 with venv and pip, and network
# access to PyPI the first time), and on Linux rdma-core's verbs header (libibverbs-dev,
# through apt-get) for the verbs layout test; for the cross steps, rustup's aarch64 targets
# and, on Linux, Debian's aarch64 cross gcc and libc and qemu-user, Debian's llvm (llvm-nm,
# llvm-objdump) and, from PyPI into target/zigbuild-venv, cargo-zigbuild and ziglang; on
# macOS, `flock` (Homebrew's, for tools/mlx-venv.sh) and MLX's macOS wheel in place of the
# Linux CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every release build here keeps debug assertions and overflow checks, so the whole suite
# (the unit tests' multi-rank simulations, SIMD kernels and shared memory among it) runs
# with them in one build that every later release step reuses. A separate dev-profile build
# of the unit tests for them took 288 s of the budget.
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
os=$(uname -s)

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

# ---- Other targets (cross_*) ---------------------------------------------------------------

# The CPU models qemu runs the aarch64 tests on. The first runs every aarch64 test; each
# other one reruns only the tests of the SIMD kernels and their dispatch (ffi's simd::
# and the library's reduce::, where the kernels meet the scalar oracle at every level the
# dispatcher offers): the rest does not depend on CPU features, and the ring simulations'
# property tests alone take minutes under qemu. `max` has every feature qemu emulates
# (FEAT_FP16, FEAT_BF16, ...); cortex-a57 is ARMv8.0 with neither, so the dispatcher's
# fallbacks for half precision run too.
read -r -a qemu_cpus <<<"${NUVEC_QEMU_CPUS:-max cortex-a57}"
aarch64=aarch64-unknown-linux-gnu
# Which multi-process ring tests run under qemu (libtest name filters): each emulated rank
# is many times slower than a native one, and the full matrix (tests/ring.rs, up to 5
# ranks x 2 connections x every dtype) takes the better part of an hour there, so a subset
# that still covers 1 to 3 ranks, 1 and 2 connections per peer, both wires, every dtype and
# op, and float sums with real rounding on one odd ring of two connections per peer (not
# all four float cases). The native steps run them all.
read -r -a qemu_ring_tests <<<"${NUVEC_QEMU_RING_TESTS:-float_sums_agree_p3_c2 matrix_p1_c1 matrix_p2_c2}"
# Whether this host runs the aarch64 Linux steps: Debian's cross toolchain and qemu-user
# are for x86-64 Linux hosts (an aarch64 host runs those tests natively, above).
cross_aarch64_here() { [[ "$os" == Linux && "$(uname -m)" == x86_64 ]]; }

# Apt packages the aarch64 steps need: the cross gcc links (and builds blake3's C), the
# cross libc is what qemu's -L points at, qemu-user runs the binaries.
cross_packages() {
  cross_aarch64_here || return 0
  command -v aarch64-linux-gnu-gcc >/dev/null || echo gcc-aarch64-linux-gnu
  [[ -f /usr/aarch64-linux-gnu/lib/libc.so.6 ]] || echo libc6-dev-arm64-cross
  command -v qemu-aarch64 >/dev/null || echo qemu-user
}

# rustup targets for the cross steps (standard libraries only; a no-op when present).
cross_targets() {
  [[ "$os" == Linux ]] || return 0
  local targets=(aarch64-apple-darwin)
  cross_aarch64_here && targets+=("$aarch64")
  rustup target add "${targets[@]}"
}

# Runs cargo for aarch64 Linux under qemu with CPU model $1. The test binary's ranks are
# its own child processes, which the kernel cannot execute without a binfmt handler (a
# fresh machine or a container has none), so the harness starts them through the same
# runner (NUVEC_TEST_RUNNER, tools/src/testing.rs). Emulated ranks are many times slower
# than native ones, so the harness's default deadlines are stretched (NUVEC_TEST_TIME_SCALE).
cross_aarch64_cargo() {
  local cpu=$1; shift
  local runner="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $cpu"
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner" \
    NUVEC_TEST_RUNNER="$runner" \
    NUVEC_TEST_TIME_SCALE="${NUVEC_TEST_TIME_SCALE:-6}" \
    NUVEC_SIM_CASES="${NUVEC_SIM_CASES:-8}" \
    cargo "$@"
}

# Release builds: under qemu the property tests and the ring tests run many times faster
# than in a debug build, which more than repays the longer compile; the debug assertions
# ran natively above.
cross_aarch64_tests() {
  local first=${qemu_cpus[0]} cpu
  step "aarch64 Linux under qemu (-cpu $first): unit tests, simulations, property tests"
  if ! cross_aarch64_here; then
    echo "SKIPPED: the aarch64 Linux steps run on x86-64 Linux hosts (this is $os $(uname -m))"
    return 0
  fi
  # qemu-user does not emulate io_uring_setup (ENOSYS): the io_uring binding's tests run
  # natively above (and under AddressSanitizer), not here.
  echo "io_uring tests skipped under qemu-user: it does not emulate io_uring (ENOSYS)"
  cross_aarch64_cargo "$first" test --release --target "$aarch64" \
    -p nuvec-distributed-engine -p nuvec-distributed-ffi --lib -- --skip uring::

  step "aarch64 Linux under qemu (-cpu $first): multi-process ring tests ${qemu_ring_tests[*]}"
  cross_aarch64_cargo "$first" test --release --target "$aarch64" --test ring -- "${qemu_ring_tests[@]}"

  for cpu in "${qemu_cpus[@]:1}"; do
    step "aarch64 Linux under qemu (-cpu $cpu): the SIMD kernels and their dispatch"
    cross_aarch64_cargo "$cpu" test --release --target "$aarch64" \
      -p nuvec-distributed-engine -p nuvec-distributed-ffi --lib -- simd:: reduce::
  done
}

# clippy for the targets this host does not build natively. Every feature but `probes`:
# the usdt crate's macros choose the probe registers by the architecture they themselves
# were compiled for (the host's), so probes cannot be cross-compiled to another
# architecture; the native lint steps cover them on each platform.
cross_clippy() {
  local features=(--features jaccl) target
  if [[ "$os" != Linux ]]; then
    step "lints for aarch64 Linux and macOS from Linux"
    echo "SKIPPED: on $os the lint steps above are the native build; the cross lints run on Linux"
    return 0
  fi
  if cross_aarch64_here; then
    step "lints, aarch64 Linux: default features, then every feature but probes"
    for f in "" "${features[*]}"; do
      # shellcheck disable=SC2086 # $f is empty or two words
      CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
        cargo clippy --target "$aarch64" --workspace --all-targets $f -- -D warnings
    done
  fi
  # ring (the native wire's AES-256-GCM) compiles its C and assembly for the target in its
  # build script, which runs in a check too, so this step needs a C compiler for macOS, which
  # a Linux host lacks: cargo-zigbuild's clippy runs cargo with zig as that compiler (zig
  # ships macOS's libc headers; a check links nothing, so no SDK). blake3's NEON C needs no
  # compiling for a check, which needs only the Rust API, which blake3's pure build has too.
  # The nuvec_pure_blake3 cfg (Cargo.toml) selects that build for this step only: real
  # builds, on a Mac and the link step below included, keep the C.
  target=aarch64-apple-darwin
  step "lints, macOS ($target, zig as C compiler, pure-Rust blake3): default features, then every feature but probes"
  zigbuild_venv "$zigbuild_dir"
  for f in "" "${features[*]}"; do
    # shellcheck disable=SC2086
    RUSTFLAGS="--cfg nuvec_pure_blake3" PATH="$PWD/$zigbuild_dir/bin:$PATH" \
      cargo-zigbuild clippy --target "$target" --workspace --all-targets $f -- -D warnings
  done
}

# cargo-zigbuild and zig (ziglang), pinned, from PyPI into a venv under target/: the macOS
# lint and link steps use zig as the C compiler (and the link step as the linker too).
# Installs only when a pin is missing.
zigbuild_dir=target/zigbuild-venv
zigbuild_pins=(cargo-zigbuild==0.24.1 ziglang==0.17.1)
zigbuild_venv() {
  local venv=$1 have="" pin
  [[ -x "$venv/bin/pip" ]] && have=$("$venv/bin/pip" freeze)
  for pin in "${zigbuild_pins[@]}"; do
    if ! grep -qxF "$pin" <<<"$have"; then
      python3 -m venv "$venv"
      "$venv/bin/pip" install -q "${zigbuild_pins[@]}"
      break
    fi
  done
}

# macOS compiled and linked from Linux. cargo-zigbuild runs cargo with zig as the C compiler
# and linker for aarch64-apple-darwin (zig ships macOS's libc headers and libSystem's stubs),
# so unlike the lint step blake3's real C (NEON) is compiled and linked. Both come from PyPI,
# pinned, into a venv under target/ (zigbuild_venv). The dev profile without debug info: what
# is checked here is what links and what the binaries import, which optimisation does not
# change (their code runs on the Mac workflow); from a cold target directory on 2 vCPUs the
# release build took 277 s, this one 118 s, both passing the same import checks.
#
# What links: every member but the root crate, with the engine's `jaccl` feature: the
# engine, ffi and the verbs provider (a dylib), the `nuvec` tools, the examples and the
# JACCL provider test binary, whose imports are checked. The other test binaries link the
# same libraries; their code is type-checked for macOS by the lint step, and compiling
# them all in release for macOS took about two of this step's five and a half minutes. The
# root crate (nuvec-distributed) and nuvec-core 0.5 under it compile for macOS with `jaccl`
# (an rlib links nothing, and the lint step type-checks the default features), but nothing
# that links nuvec-core can be linked from Linux: nuvec-gpu, a macOS dependency of
# nuvec-core, links the Metal, Foundation and CoreFoundation frameworks and libobjc (through
# objc2), whose stubs are in Apple's SDK, which zig does not ship and which is not
# redistributable; the Mac workflow links them. `probes` stays native (see cross_clippy).
# The binaries are for checking, not shipping.
#
# rustc asks xcrun for the SDK at every link and warns without one: an empty SDK root, with
# the two directories the linker searches, silences that and changes nothing in the binaries
# (the same LC_BUILD_VERSION; zig provides what they link).
cross_macos_link() {
  local target=aarch64-apple-darwin venv=$zigbuild_dir sdk=target/zigbuild-sdk
  step "macOS ($target) compiled and linked with cargo-zigbuild, blake3's C included; imports checked"
  if [[ "$os" != Linux ]]; then
    echo "SKIPPED: on $os the native build above is the macOS build"
    return 0
  fi
  zigbuild_venv "$venv"
  mkdir -p "$sdk/usr/lib" "$sdk/System/Library/Frameworks"
  local zb=(env PATH="$PWD/$venv/bin:$PATH" SDKROOT="$PWD/$sdk" CARGO_PROFILE_DEV_DEBUG=0
    cargo zigbuild --target "$target")
  framework_stubs "$target" "$sdk" "${zb[@]}"
  "${zb[@]}" --workspace --exclude nuvec-distributed --lib --bins --examples \
    --test jaccl_provider --features nuvec-distributed-engine/jaccl
  "${zb[@]}" -p nuvec-distributed --lib --features jaccl
  check_macos_imports "target/$target/debug"
}

# sysinfo (the tools' load check before a bench) links IOKit and CoreFoundation on macOS,
# whose stubs are in Apple's SDK only. The SDK root gets text stubs (TAPI .tbd, the format of
# zig's own libSystem stub) declaring the symbols sysinfo and its two objc2 crates import
# from them, read with llvm-nm from their compiled objects (sysinfo's library alone, with its
# default features, a superset of the tools'; a library build links nothing), so every other
# symbol is still resolved for real and the binaries name the frameworks' real install
# paths. Fails if a framework's symbols cannot be found.
framework_stubs() {
  local target=$1 sdk=$2; shift 2
  "$@" -p sysinfo --lib
  local deps=target/$target/debug/deps undefined="" rlib name prefix symbols
  for rlib in "$deps"/libsysinfo-*.rlib "$deps"/libobjc2_io_kit-*.rlib \
    "$deps"/libobjc2_core_foundation-*.rlib; do
    [[ -f "$rlib" ]] && undefined+=$(llvm-nm --undefined-only -j "$rlib" 2>/dev/null)$'\n'
  done
  for name in IOKit CoreFoundation; do
    prefix=$([[ $name == IOKit ]] && echo IO || echo CF)
    symbols=$(grep -E "^_k?${prefix}[A-Z]" <<<"$undefined" | sort -u | paste -sd, - | sed 's/,/, /g')
    if [[ -z "$symbols" ]]; then
      echo "FAILED: no $name symbols imported by sysinfo's objects in $deps" >&2
      return 1
    fi
    local dir="$sdk/System/Library/Frameworks/$name.framework"
    mkdir -p "$dir"
    cat >"$dir/$name.tbd" <<STUB
--- !tapi-tbd
tbd-version:     4
targets:         [ arm64-macos ]
install-name:    '/System/Library/Frameworks/$name.framework/Versions/A/$name'
exports:
  - targets:         [ arm64-macos ]
    symbols:         [ $symbols ]
...
STUB
  done
}

# What the Mac binaries must import and carry: libSystem's __ulock_wait and __ulock_wake (the
# shared-memory transport's sleep, ffi/src/shm.rs), dlopen and dlsym (the verbs library is
# loaded at run time, never linked: ffi/src/verbs/loader.rs) and the name librdma.dylib; the
# nuvec binary also blake3's NEON C; none may link a verbs library. The provider dylib must
# export every function the binding resolves by name (read from loader.rs). Fails naming what
# is missing.
check_macos_imports() {
  local dir=$1 bin sym missing=()
  local tests=("$dir"/deps/jaccl_provider-*)
  local bins=("$dir/nuvec")
  for bin in "${tests[@]}"; do [[ -x "$bin" && "$bin" != *.d ]] && bins+=("$bin") && break; done
  [[ ${#bins[@]} -eq 2 ]] || missing+=("a jaccl_provider test binary in $dir/deps")
  for bin in "${bins[@]}"; do
    [[ -f "$bin" ]] || { missing+=("$bin"); continue; }
    local undefined
    undefined=$(llvm-nm --undefined-only -j "$bin")
    for sym in ___ulock_wait ___ulock_wake _dlopen _dlsym; do
      grep -qxF "$sym" <<<"$undefined" || missing+=("$bin imports no ${sym#_}")
    done
    grep -qaF librdma.dylib "$bin" || missing+=("$bin does not name librdma.dylib")
    # Outputs go through variables: with pipefail, `grep -q` closing a pipe early would
    # fail the producer.
    local linked
    linked=$(llvm-objdump --macho --dylibs-used "$bin")
    if grep -qiE 'rdma|ibverbs' <<<"$linked"; then
      missing+=("$bin links a verbs library")
    fi
  done
  local defined
  defined=$(llvm-nm --defined-only -j "$dir/nuvec")
  grep -qxF _blake3_hash_many_neon <<<"$defined" \
    || missing+=("$dir/nuvec has no blake3 NEON code (_blake3_hash_many_neon)")
  local provider=$dir/libnuvec_verbs_provider.dylib exported
  exported=$(llvm-nm --defined-only --extern-only -j "$provider")
  for sym in $(grep -o 'b"ibv_[a-z_]*' ffi/src/verbs/loader.rs | cut -c3-); do
    grep -qxF "_$sym" <<<"$exported" || missing+=("$provider does not export $sym")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    printf 'macOS binaries: %s\n' "${missing[@]}" >&2
    return 1
  fi
  echo "checked: ${bins[*]} import __ulock_wait, __ulock_wake, dlopen and dlsym, name librdma.dylib and link no verbs library; nuvec has blake3's NEON C; $provider exports the binding's functions"
}

# macOS's counterpart of the bpftrace step: tests/probes_dtrace.rs attaches dtrace (as root,
# or through passwordless sudo, which GitHub's macOS runners have) to a rank.
cross_probes_dtrace() {
  step "probes under DTrace (macOS; needs root or passwordless sudo; fails if dtrace cannot attach)"
  if [[ "$os" != Darwin ]]; then
    echo "SKIPPED: the DTrace test is macOS's (this is $os; the bpftrace step covers the probes here)"
  elif [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then
    cargo test --release --all-features --test probes_dtrace -- --ignored
  else
    echo "NOT RUN: tests/probes_dtrace.rs needs root or passwordless sudo for dtrace"
  fi
}

# The multi-process ring tests at each forced SIMD level below the best one, on x86-64
# (this machine's best is AVX-512, so the default-level run above covers that). On other
# architectures, scalar only.
#
# A subset (NUVEC_FORCED_LEVEL_TESTS): every dtype and op at P = 2..4 with one and two
# connections, and the float sums' agreement; the larger rings add nothing level-specific.
read -r -a forced_level_tests <<<"${NUVEC_FORCED_LEVEL_TESTS:-matrix_p2_c2 matrix_p3_c1 matrix_p4_c1 float_sums_agree}"
cross_forced_levels() {
  local levels=(scalar) level
  [[ "$(uname -m)" == x86_64 ]] && levels=(avx2 scalar)
  for level in "${levels[@]}"; do
    step "ring tests ${forced_level_tests[*]} with NUVEC_DISTRIBUTED_SIMD=$level (release)"
    NUVEC_DISTRIBUTED_SIMD=$level cargo test --release --test ring -- "${forced_level_tests[@]}"
  done
}

step "installing test dependencies"
if [[ "$os" == Darwin ]]; then
  # mlx-venv.sh serialises installs with flock(1), which macOS lacks; and MLX's Linux CPU
  # build (mlx[cpu]) is no macOS wheel: the plain `mlx` wheel is (the interop ranks put
  # their collectives on the CPU stream either way).
  command -v flock >/dev/null || brew install flock
  export NUVEC_MLX_SPEC=${NUVEC_MLX_SPEC:-mlx==0.32.*}
fi
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
  # llvm-nm and llvm-objdump read the Mach-O binaries of the macOS link step.
  command -v llvm-nm >/dev/null && command -v llvm-objdump >/dev/null || need+=(llvm)
  [[ -f /usr/include/infiniband/verbs.h ]] || need+=(libibverbs-dev)
  mapfile -t cross < <(cross_packages)
  need+=("${cross[@]}")
  if [ ${#need[@]} -gt 0 ]; then
    sudo_cmd=()
    [[ "$(id -u)" -ne 0 ]] && sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${need[@]}"
  fi
fi
"$python" -c 'import mlx.core as mx; print("MLX", mx.__version__, "at", mx.__file__)'
# The toolchain rust-toolchain.toml pins (rustup installs it on first use too; asking
# here makes a missing component or target an error of this step, not of a later one).
toolchain=$(sed -n 's/^channel = "\(.*\)"$/\1/p' rust-toolchain.toml)
rustup toolchain install "$toolchain" --profile minimal --component rustfmt,clippy
cross_targets

step "formatting"
cargo fmt --all -- --check
# tests/dropin is a project of its own (outside the workspace), which --all does not reach.
cargo fmt --manifest-path tests/dropin/Cargo.toml -- --check

step "SAFETY.md lists every unsafe site of ffi/"
tools/check-safety.sh

# clippy's incompatible_msrv lint (on by default) also holds std API use to rust-version.
step "lints, all features"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "lints, default features"
cargo clippy --workspace --all-targets -- -D warnings

cross_clippy

step "docs, all features and default features"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --all-features
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

# Two minimums: the root crate (nuvec's front end) needs what nuvec-core 0.5 needs, Rust
# 1.99, the toolchain rust-toolchain.toml pins, so every step above already built it with
# exactly that; the engine, ffi and tools keep the workspace's older rust-version, checked
# here with that toolchain.
msrv=$(sed -n '/^\[workspace.package\]/,/^\[/s/^rust-version = "\([0-9.]*\)"$/\1/p' Cargo.toml)
[[ "$msrv" =~ ^[0-9]+\.[0-9]+$ ]] && msrv=$msrv.0
step "MSRV: the engine with Rust $msrv (the front end's 1.99 is the pinned toolchain)"
if rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1; then
  # The engine and ffi with either feature set, against the committed Cargo.lock (so a
  # dependency that needs a newer compiler fails here too). Tests, benches and tools are
  # built with the pinned toolchain only.
  cargo "+$msrv" check -p nuvec-distributed-engine --lib --all-features
  cargo "+$msrv" check -p nuvec-distributed-engine --lib
else
  # Do not pretend: without that toolchain only clippy's incompatible_msrv (lints steps)
  # checked anything, and it sees std APIs newer than the MSRV, not language features,
  # lints or dependencies that need a newer compiler.
  echo "NOT CHECKED: rustup cannot install Rust $msrv here; only clippy's incompatible_msrv held the code to it"
fi

# JACCL's real verbs path (the binding in ffi/src/verbs, src/transport/rdma/verbs.rs) has no
# RDMA device here; the project's test provider stands in for libibverbs, loaded through
# NUVEC_DISTRIBUTED_VERBS_LIBRARY. Every collective across processes, meshes of 2 to 8 and
# rings of 1 to 4 cables, faults included (tests/jaccl_provider.rs, about half a minute,
# run by the whole suite below, which needs the library built first).
step "the test verbs provider (ffi/verbs-provider), for tests/jaccl_provider.rs"
cargo build --release -p nuvec-verbs-provider

step "tests, all features (release, with debug assertions and overflow checks): the whole suite"
cargo test --workspace --all-features --release

# The integration tests are the same with default features except where the features change
# the library under them: the ring's collectives (probes compiled out) and the README
# example. jaccl.rs and probes.rs exist only with their features, and the unit tests
# differ only by those. The whole ring matrix ran above with the features on (about three
# minutes here); the features change nothing in its code but the probes, so a subset that
# crosses every ring size class (one rank, a neighbour pair, two connections, an odd ring,
# five ranks) runs here, with the example.
read -r -a default_ring_tests <<<"${NUVEC_DEFAULT_RING_TESTS:-matrix_p1_c1 matrix_p2_c2 matrix_p3_c2 matrix_p5_c1 float_sums_agree_p4_c1}"
step "tests, default features (release): the example and the ring tests ${default_ring_tests[*]}"
cargo test --release --test example
cargo test --release --test ring -- --skip native "${default_ring_tests[@]}"

# A nuvec user's project (tests/dropin: nuvec and nuvec-nn from crates.io, this crate patched
# in with one [patch.crates-io] line): cargo tree must show this crate as its only
# nuvec-distributed; it is built in the dev profile in target/dropin (its own Cargo.lock, so
# nuvec and its dependencies compile there once per clean clone: about 90 s of CPU, 55 s on
# the 2-core box, against 110 s in release; afterwards only this crate and the engine), then
# run under `nuvec launch` at 2 and 4 ranks on MLX's wire and the native wire, every
# collective checked against its exact result (about 1.2 s for the four launches).
step "drop-in for nuvec users: tests/dropin under nuvec launch -n 2 and 4, both wires"
cargo test --release --test dropin -- --ignored --nocapture

# examples/llama.rs generates 32 tokens with a 4-layer model sharded over 2 ranks and exits
# non-zero unless every token and the logits behind it match the unsharded model's; each
# run prints which transport its ranks used, checked here, so a shared-memory run that fell
# back to TCP fails. Then a run with one rank's attention shard zeroed, which must fail
# naming the token and the rank. The four runs take about 6 s. The example is the one the
# whole suite built (the same selection and features, so cargo finds it fresh; building it
# again with default features took 23 s, and the features add probes and JACCL, which a TCP
# and shared-memory run does not reach). So is the launcher, which the chaos steps and the
# doctor's netns test below reuse (NUVEC_BIN for tools/chaos.sh): building it for
# nuvec-tools alone resolved other features and compiled the engine and the tools again,
# 63 s.
step "Llama example across 2 ranks: MLX wire, native over TCP, native over shared memory, a dropped shard"
cargo build --release --workspace --all-features --example llama --bin nuvec
export NUVEC_BIN=$PWD/target/release/nuvec
llama() { # $1: the transport the run must report; then nuvec launch's options
  local transport=$1 out; shift
  out=$(target/release/nuvec launch -n 2 "$@" -- target/release/examples/llama 2>&1) \
    || { echo "$out"; return 1; }
  echo "$out"
  grep -q "rank 0: .*rank 1 over $transport" <<<"$out" \
    || { echo "FAILED: rank 0 did not report reaching rank 1 over $transport"; return 1; }
}
llama tcp
llama tcp --wire native --env NUVEC_DISTRIBUTED_SHM=0
llama "shared memory" --wire native
if out=$(target/release/nuvec launch -n 2 -- target/release/examples/llama --drop-shard 1 2>&1); then
  echo "$out"; echo "FAILED: the check passed with rank 1's attention shard dropped"; exit 1
fi
grep -q "MISMATCH rank 1: token 0 " <<<"$out" \
  || { echo "$out"; echo "FAILED: the dropped shard's mismatch does not name rank 1 and token 0"; exit 1; }
echo "the dropped shard failed as it must: $(grep -m1 'MISMATCH rank 1' <<<"$out")"

# The io_uring driver (Options::io, Linux): a subset of the matrix (both wires), the fault
# tests that kill, stop and close from another thread mid-transfer, the zero-allocation and
# idle tests and MLX interop, rerun with NUVEC_DISTRIBUTED_IO=uring (the whole suite above ran
# on epoll, Auto's choice); then the io_uring binding's tests under AddressSanitizer. The
# test binaries are the whole suite's (`--workspace --all-features`, so nothing is rebuilt:
# selecting the engine alone resolved other features and compiled it twice more, a minute).
step "io_uring driver: ring, fault, resource and interop tests with NUVEC_DISTRIBUTED_IO=uring"
if [[ "$os" == Linux ]]; then
  NUVEC_DISTRIBUTED_IO=uring cargo test --release --workspace --all-features --test ring --test resilience \
    --test resources --test interop --test io -- \
    matrix_p2_c2 matrix_p3_c1 native_matrix_p3_c1 float_sums_agree_p2 \
    a_rank_that_exits_is_named_by_ranks_that_are_not_its_neighbours_p4 \
    a_rank_that_exits_during_a_large_all_sum_is_named_by_every_survivor_p4 \
    close_from_another_thread kill_9_during_a_small_all_sum_p3 \
    native_kill_9_during_a_small_all_sum_p4 blame_a_stopped_rank_small \
    a_stopped_rank_is_named_within_the_timeout \
    do_not_allocate an_idle interop_p2_c1 interop_p3_c2 io_uring
  # The native wire's in-crate tests (mismatches at P = 2..4, a rank that dies mid-call or
  # never calls, close) take the driver the variable names.
  NUVEC_DISTRIBUTED_IO=uring cargo test --release --workspace --all-features --lib -- native:: transport::tcp::tests
  # Faults injected with steps waiting in the kernel at P = 3..5 (their receives take a
  # failure notice's urgent byte first): every survivor must still name the faulted rank.
  NUVEC_DISTRIBUTED_IO=uring tools/chaos.sh 5
  step "io_uring binding under AddressSanitizer (tools/asan-uring.sh; needs nightly)"
  tools/asan-uring.sh
else
  echo "SKIPPED: io_uring is Linux's (this is $os)"
fi

cross_macos_link
cross_forced_levels
cross_aarch64_tests

step "network-namespace test (optional: needs root and ip netns)"
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && ip netns add nuvec-probe-$$ 2>/dev/null; then
  ip netns del nuvec-probe-$$
  cargo test --release --test netns -- --ignored
  cargo test --release --workspace --all-features --test doctor -- --ignored netns
else
  echo "NOT RUN: tests/netns.rs and tools/tests/doctor.rs's netns test need root and a working 'ip netns' (iproute2); this machine has neither or refuses"
fi

step "mixed-hosts test in network namespaces (optional: needs root, ip netns, unshare and nsenter)"
# Two hosts of two ranks: each a network namespace with its own tmpfs on /dev/shm, joined
# by a veth pair (about 5 s).
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v nsenter >/dev/null \
  && ip netns add nuvec-probe-$$ 2>/dev/null; then
  if ip netns exec nuvec-probe-$$ unshare --mount --propagation private \
    sh -c 'mount -t tmpfs nuvec-probe /dev/shm' 2>/dev/null; then
    ip netns del nuvec-probe-$$
    cargo test --release --test hosts -- --ignored
  else
    ip netns del nuvec-probe-$$
    echo "NOT RUN: tests/hosts.rs needs a tmpfs mounted on /dev/shm in a private mount namespace inside a network namespace; this machine refuses"
  fi
else
  echo "NOT RUN: tests/hosts.rs needs root, a working 'ip netns' (iproute2) and nsenter (util-linux); this machine has not all"
fi

step "shared-memory domain and hierarchical-group tests (optional: needs root and a private mount namespace)"
# Two "hosts" on one kernel: ranks in mount namespaces with another directory bound on
# /dev/shm (a few seconds).
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null \
  && unshare --mount --propagation private sh -c 'mount --bind "${TMPDIR:-/tmp}" /dev/shm' 2>/dev/null; then
  cargo test --release --test shm_domains -- --ignored
else
  echo "NOT RUN: tests/shm_domains.rs needs root, unshare and a bind mount on /dev/shm in a private mount namespace; this machine has neither or refuses"
fi

# Rings of 3 to 5 ranks, one rank killed, stopped, cut off or late per round; every survivor
# must name it in time. As root the cut-link faults run too (network namespaces), else the
# run says they were skipped. About 5 s a round.
step "chaos run, 5 rounds (tools/chaos.sh 5)"
tools/chaos.sh 5
step "chaos run on the native wire, 5 rounds (tools/chaos.sh 5 --wire native)"
tools/chaos.sh 5 --wire native
# Recovery: one rank killed or stopped per round; the survivors shrink and verify, a
# stopped victim woken later must find itself left out, the victim restarts at its address
# and the survivors rejoin; every collective checked. A kill round takes 1 to 2 s, a stop
# round about 5 s: 5 rounds took 7 to 23 s here (100 rounds: 270 s MLX wire, 222 s native).
step "chaos recovery, 5 rounds (tools/chaos.sh 5 --recover)"
tools/chaos.sh 5 --recover
step "chaos recovery on the native wire, 5 rounds (tools/chaos.sh 5 --recover --wire native)"
tools/chaos.sh 5 --recover --wire native

step "probes under bpftrace (needs root and bpftrace; fails if they cannot attach)"
if [ "$(id -u)" = 0 ] && command -v bpftrace >/dev/null; then
  cargo test --release --all-features --test probes -- --ignored
else
  echo "NOT RUN: tests/probes.rs's bpftrace test needs root and bpftrace; this machine has not both"
fi

cross_probes_dtrace

step "fuzz smoke run (4 s per target)"
tools/fuzz.sh --seconds 4

step "all checks passed"
printf '%s\n' "${timings[@]}"
printf '%5ds  in all\n' $((SECONDS - started))
