#!/usr/bin/env bash
# The README's demo command (until the fine-tune example exists): installs
# what is missing, builds tpurun and slice_check, and runs slice_check on an
# emulated v6e 4x4 slice: 16 ranks on 4 emulated hosts, each printing its
# RankInfo and checking a Gloo all_reduce over the coordination store.
# Extra arguments go to slice_check (e.g. --die-rank 5).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
"$root/tools/install_deps.sh"
BUILD_DIR="$build" "$root/tools/build.sh" tpurun slice_check
exec "$build/tpu_runtime/launcher/tpurun" --accelerator-type TPU-V6E --topology 4x4 \
  --hosts-emulated --timeout 300s -- "$build/examples/slice_check" "$@"
