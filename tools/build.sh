#!/usr/bin/env bash
# Configures (once) and builds the project into ${BUILD_DIR:-build}.
# Usage: tools/build.sh [ninja targets...]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
# Relative paths in the cache key: a fresh clone elsewhere (CI) reuses objects
# compiled in another checkout of the same sources.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
# One build at a time per build dir (two scripts running ninja on one tree
# corrupt its logs); TPU_DIST_BUILD_LOCK names another lock file.
mkdir -p "$build"
exec 9>"${TPU_DIST_BUILD_LOCK:-$build/.tpu_dist_build.lock}"
if ! flock -n 9; then
  echo "build.sh: another build holds ${TPU_DIST_BUILD_LOCK:-$build/.tpu_dist_build.lock}; waiting" >&2
  flock 9
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
# Two cores, ~1 GiB per libtorch translation unit: -j2 fits in memory.
cmake --build "$build" -j "${BUILD_JOBS:-2}" ${1:+--target "$@"}
