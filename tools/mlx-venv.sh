#!/usr/bin/env bash
# Makes (once) the Python venv with MLX's CPU build that the interop tests run MLX ranks in,
# and prints its python's path. Safe to run concurrently: the first caller installs, the
# others wait on the lock.
#   NUVEC_MLX_VENV   where the venv lives (default: target/mlx-venv in the repository)
#   NUVEC_MLX_SPEC   what to install (default: mlx[cpu]==0.32.*)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${NUVEC_MLX_VENV:-$root/target/mlx-venv}
spec=${NUVEC_MLX_SPEC:-mlx[cpu]==0.32.*}
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ! "$venv/bin/python" -c 'import mlx.core, numpy' >/dev/null 2>&1; then
  echo "mlx-venv: installing $spec and numpy into $venv" >&2
  if ! python3 -m venv "$venv" >&2; then
    # Debian's system python keeps venv in a separate package.
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
      apt-get update -q >&2 && apt-get install -y -q python3-venv >&2
      python3 -m venv "$venv" >&2
    else
      echo "mlx-venv: python3 -m venv failed; install python3's venv module" >&2
      exit 1
    fi
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check "$spec" numpy >&2
  "$venv/bin/python" -c 'import mlx.core as mx; assert mx.distributed.is_available("ring")' >&2
fi
echo "$venv/bin/python"
