#!/usr/bin/env bash
# Runs the benchmark binaries (bench/) and prints their tables; writes one
# JSON file with every result plus the date, machine and load.
#
#   tools/bench.sh [--build DIR] [--out FILE] [--quick] [--worlds "2 4 8 16"]
#                  [--skip_collectives] [--skip_train] [-- extra collectives_bench flags]
#
# DIR defaults to build-bench next to this script's repository; FILE to
# DIR/bench_results.json. --quick runs every binary in its smoke mode.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo/build-bench"
out=""
quick=""
worlds="2 4 8 16"
run_coll=1
run_train=1
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --quick) quick="--quick"; shift ;;
    --worlds) worlds="$2"; shift 2 ;;
    --skip_collectives) run_coll=0; shift ;;
    --skip_train) run_train=0; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
out="${out:-$build/bench_results.json}"
tmp="$(mktemp -d /tmp/tpud_bench_sh_XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

export OMP_NUM_THREADS=1
# Every run has a deadline: a hung rank must not hang the driver.
deadline=900
parts=()
if [[ $run_coll == 1 ]]; then
  for w in $worlds; do
    # Gloo on many ranks and large sizes takes seconds per op on 2 cores:
    # above 8 ranks compare with Gloo up to 16 MiB only.
    gloo_cap=()
    if [[ $w -gt 8 ]]; then gloo_cap=(--gloo_max_bytes=16777216); fi
    timeout "$deadline" "$build/bench/collectives_bench" --world="$w" $quick "${gloo_cap[@]}" \
      --json_out="$tmp/coll_w$w.json" --benchmark_format=json \
      --benchmark_out="$tmp/gbench_coll_w$w.json" "${extra[@]}" \
      | sed -n '/^== collectives/,$p'
    parts+=("$tmp/coll_w$w.json")
  done
fi
if [[ $run_train == 1 && -x "$build/bench/train_bench" ]]; then
  for w in 2 4; do
    timeout "$deadline" "$build/bench/train_bench" --world="$w" $quick \
      --json_out="$tmp/train_w$w.json" --benchmark_format=json | sed -n '/^== train/,$p'
    parts+=("$tmp/train_w$w.json")
  done
  timeout "$deadline" "$build/bench/train_bench" --world=2 --fsdp_dtype=bf16 $quick \
    --json_out="$tmp/train_w2_bf16.json" --benchmark_format=json | sed -n '/^== train/,$p'
  parts+=("$tmp/train_w2_bf16.json")
fi
if [[ -x "$build/bench/gemma_bench" ]]; then
  smoke=""
  [[ -n $quick ]] && smoke="--smoke"
  timeout "$deadline" "$build/bench/gemma_bench" $smoke --benchmark_format=json \
    --benchmark_out="$tmp/gemma.json" --benchmark_out_format=json > /dev/null
  parts+=("$tmp/gemma.json")
fi
{
  printf '{"date": "%s", "machine": "%s", "cpus": %s, "load_end": "%s", "results": [' \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)"
  sep=""
  for p in "${parts[@]}"; do printf '%s' "$sep"; cat "$p"; sep=","; done
  printf ']}\n'
} > "$out"
echo "JSON: $out"
