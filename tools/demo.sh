#!/usr/bin/env bash
# The README's demo command: installs what is missing, builds tpurun,
# gemma_finetune and the rest of what `cmake --install build` copies
# (`installable`) if needed, and fine-tunes the bundled tiny Gemma 4
# (data/tiny_gemma) on the bundled instruction set (data/instructions) across
# an emulated TPU v6e 4x4 slice: 16 ranks on 4 emulated hosts x 4 devices,
# FSDP over all 16, 3 epochs. Rank 0 prints one line per epoch and the final
# metrics; checkpoints and metrics.jsonl go under $STORAGE_PATH (default: a
# fresh temp dir). Plot the curves with
#   tools/plot_metrics <storage>/<run>/metrics.jsonl -o curves.png
#
# The seed's lr 2e-5 barely moves a randomly initialised tiny model, so the
# demo trains with --lr 3e-3 and --max-seq-len 128 (the bundled rows are
# short); the binary's defaults stay the seed's. Extra arguments go to
# gemma_finetune (e.g. --num-epochs 1). DEMO_TPURUN_ARGS replaces the slice
# arguments (e.g. DEMO_TPURUN_ARGS="--nproc 16" for one host).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
"$root/tools/install_deps.sh"
BUILD_DIR="$build" "$root/tools/build.sh" tpurun gemma_finetune installable
storage="${STORAGE_PATH:-$(mktemp -d "${TMPDIR:-/tmp}/gemma_finetune_demo.XXXXXX")}"
# The torch 2.15 wheel multiplies bf16 matrices fast only on CPUs with bf16
# instructions (AVX512-BF16 / AMX); elsewhere its bf16 GEMM is ~100x slower
# than fp32 (measured: 0.3-0.4 vs 40-70 GFLOP/s on an AVX2-only EPYC, and a
# 2-rank fine-tune epoch 14.5 s in bf16 vs 2.9 s in fp32). There the demo
# computes in fp32; pass --bf16=true to override.
precision=()
if ! grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo 2>/dev/null; then
  echo "gemma_finetune demo: this CPU has no bf16 instructions: computing in fp32 (--bf16=false)"
  precision=(--bf16=false)
fi
echo "gemma_finetune demo: storage $storage"
# shellcheck disable=SC2086
exec "$build/tpu_runtime/launcher/tpurun" \
  ${DEMO_TPURUN_ARGS:---accelerator-type TPU-V6E --topology 4x4 --hosts-emulated} --timeout 900s -- \
  env OMP_NUM_THREADS=1 "$build/examples/gemma_finetune" --storage-path "$storage" \
  --num-epochs 3 --lr 3e-3 --max-seq-len 128 "${precision[@]}" "$@"
