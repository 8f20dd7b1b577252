#!/usr/bin/env bash
# The Ray path in one command: installs what is missing, builds the examples
# and the Python extension, brings up a local Ray cluster of emulated TPU hosts
# (tools/ray_cluster.sh; network namespaces as root), and runs on it
#   1. the seed's Ray Core TP check (examples/ray/ray_core_collectives.py),
#   2. the seed's Ray Train FSDP2 fine-tune (examples/ray/ray_train_llm_finetune.py),
#   3. our C++ fine-tune through tpu_dist-ray-run (--max-failures 1),
# all over tpu_dist, then takes the cluster down (also on Ctrl-C or failure).
#
#   tools/ray_demo.sh                 # the emulated v6e 4x4 (4 hosts x 4 devices)
#   tools/ray_demo.sh tpu7x-2x2x2     # the emulated TPU7x 2x2x2 (2 hosts x 8 devices)
#
# RAY_DEMO_TRAIN_ARGS replaces the Ray Train example's size flags (default: the
# seed's 1024 rows, 3 epochs, batch 4, but length 128: the bundled rows are
# short and 512 takes ~4x longer on 2 cores); STORAGE_PATH keeps the runs
# (default: a fresh temp dir). docs/ray.md has the measured times.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
spec="${1:-v6e-4x4}"
case "$spec" in
  v6e-4x4) topology=4x4 type=TPU-V6E devices=16 ;;
  tpu7x-2x2x2) topology=2x2x2 type=TPU-V7X devices=16 ;;
  v4-2x2x2) topology=2x2x2 type=TPU-V4 devices=8 ;;
  *) echo "ray_demo: unknown slice '$spec' (v6e-4x4, tpu7x-2x2x2 or v4-2x2x2)" >&2; exit 2 ;;
esac
"$root/tools/install_deps.sh"
BUILD_DIR="$build" "$root/tools/build.sh" gemma_finetune tpu_dist_python
storage="${STORAGE_PATH:-$(mktemp -d "${TMPDIR:-/tmp}/ray_demo.XXXXXX")}"
export TPU_DIST_RAY_STATE="${TPU_DIST_RAY_STATE:-/tmp/tdray-demo}"
cluster="$root/tools/ray_cluster.sh"
py="$root/.venv/bin/python"

"$cluster" down >/dev/null 2>&1 || true
trap '"$cluster" down' EXIT
"$cluster" up "$spec"

step() { echo; echo "=== ray_demo ($spec): $* ==="; }
precision=()
if ! grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
  precision=(--bf16=false)  # as tools/demo.sh: bf16 GEMM is ~100x slower without bf16 instructions
fi

step "Ray Core TP check (examples/ray/ray_core_collectives.py)"
"$cluster" exec -- "$py" "$root/examples/ray/ray_core_collectives.py" \
  --topology "$topology" --accelerator-type "$type"

step "Ray Train FSDP2 fine-tune (examples/ray/ray_train_llm_finetune.py)"
# shellcheck disable=SC2086
"$cluster" exec -- "$py" "$root/examples/ray/ray_train_llm_finetune.py" \
  --topology "$topology" --accelerator-type "$type" --num-workers "$devices" \
  --storage-path "$storage" ${RAY_DEMO_TRAIN_ARGS:---max-length 128}

step "C++ gemma_finetune through tpu_dist-ray-run"
"$cluster" exec -- "$root/.venv/bin/tpu_dist-ray-run" --topology "$topology" \
  --accelerator-type "$type" --max-failures 1 -- \
  "$build/examples/gemma_finetune" --storage_path "$storage" --run_name gemma_finetune_ray \
  --num_epochs 3 --lr 3e-3 --max_seq_len 128 "${precision[@]}"
echo
echo "ray_demo: runs under $storage"
