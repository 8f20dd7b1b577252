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
      --json_out="$tmp/coll_w$w.json" "${extra[@]}" | sed -n '/^== collectives/,$p'
    parts+=("$tmp/coll_w$w.json")
  done
fi
if [[ $run_coll == 1 && -z $quick ]]; then
  # Multi-host path: 2 emulated hosts x 2 ranks (shm inside, TCP between).
  timeout "$deadline" "$build/bench/collectives_bench" --world=4 --hosts=2 \
    --json_out="$tmp/coll_w4_2hosts.json" "${extra[@]}" | sed -n '/^== collectives/,$p'
  parts+=("$tmp/coll_w4_2hosts.json")
fi
if [[ $run_train == 1 && -x "$build/bench/train_bench" ]]; then
  for w in 2 4; do
    timeout "$deadline" "$build/bench/train_bench" --world="$w" $quick \
      --json_out="$tmp/train_w$w.json" | sed -n '/^== train/,$p'
    parts+=("$tmp/train_w$w.json")
  done
  timeout "$deadline" "$build/bench/train_bench" --world=2 --fsdp_dtype=bf16 $quick \
    --json_out="$tmp/train_w2_bf16.json" | sed -n '/^== train/,$p'
  parts+=("$tmp/train_w2_bf16.json")
fi
if [[ $run_train == 1 && -x "$build/bench/train_vs_torch" ]]; then
  # Goal 6: our FullyShard vs torch's Python FSDP2 + Gloo, same tiny Gemma.
  tvt_worlds=(2 4 16)
  [[ -n $quick ]] && tvt_worlds=(2)
  timeout "$deadline" "$repo/.venv/bin/python" "$repo/bench/python/train_vs_torch.py" $quick \
    --worlds "${tvt_worlds[@]}" --binary "$build/bench/train_vs_torch" \
    --json-out "$tmp/train_vs_torch.json"
  parts+=("$tmp/train_vs_torch.json")
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
    "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$(getconf _NPROCESSORS_ONLN)" "$(cut -d' ' -f1-3 /proc/loadavg)"
  sep=""
  for p in "${parts[@]}"; do printf '%s' "$sep"; cat "$p"; sep=","; done
  printf ']}\n'
} > "$out"
echo "JSON: $out"
# A condensed markdown summary (what bench/README.md shows): every fp32
# all_reduce, and every op/dtype at 8 B and 16 MiB; then the training rows.
jq -r '
  def f(x): if x == null then "-" else (x * 100 | round / 100 | tostring) end;
  def sz(b): if b >= 1048576 then "\(b / 1048576)MiB" elif b >= 1024 then "\(b / 1024)KiB"
             else "\(b)B" end;
  "Run \(.date), \(.machine), \(.cpus) CPUs, load at end \(.load_end).\n",
  "| op | dtype | world | size | tpu_dist us | busBw GB/s | Gloo us | Gloo busBw | Gloo/tpu_dist | memcpy us |",
  "|---|---|---|---|---|---|---|---|---|---|",
  (.results[] | select(.bench == "collectives") | . as $c | .rows[]
   | select((.op == "all_reduce" and .dtype == "fp32") or .bytes == 8 or .bytes == 16777216)
   | "| \(.op) | \(.dtype) | \(.world)\(if ($c.hosts // 1) > 1 then " (\($c.hosts) hosts)" else "" end) | \(sz(.bytes)) | \(f(.time_us)) | \(f(.busbw_GBps)) | \(f(.gloo_time_us)) | \(f(.gloo_busbw_GBps)) | \(f(.speedup_vs_gloo)) | \(f(.memcpy_time_us)) |"),
  "",
  "| train step (tpu_dist) | world | FSDP dtype | step ms | tokens/s | MFU vs bf16 GEMM | bf16 GEMM GFLOP/s | FSDP/DDP tokens/s |",
  "|---|---|---|---|---|---|---|---|",
  (.results[] | select(.bench == "train") | . as $t | .rows[]
   | "| \(.kind) | \($t.world) | \($t.fsdp_dtype) | \(f(.step_ms)) | \(f(.tokens_per_s)) | \(f(.mfu_vs_bf16_gemm * 100))% | \(f($t.gemm_bf16_GFLOPs)) | \(f($t.fsdp_over_ddp_tokens)) |")
' "$out" > "${out%.json}.md" && echo "markdown: ${out%.json}.md"
