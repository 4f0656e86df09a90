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
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "$spec" numpy >&2
  "$venv/bin/python" -c 'import mlx.core as mx; assert mx.distributed.is_available("ring")' >&2
fi
echo "$venv/bin/python"
