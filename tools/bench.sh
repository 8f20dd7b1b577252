#!/usr/bin/env bash
# Runs the benchmark binaries (bench/) and the torch.distributed benchmark,
# prints their tables, and writes one JSON file with every result plus the
# date, commit, CPU, load and each stage's wall time; a markdown summary and a
# PNG (time vs size per library) next to it.
#
#   tools/bench.sh peers [bench/peers/run.py flags]   # against MPI / DeepSpeed
#   tools/bench.sh [--build DIR] [--out FILE] [--quick] [--worlds "2 4 8 16"]
#                  [--py_worlds "2 4 16"] [--tvt_repeats N]
#                  [--skip_collectives] [--skip_p2p] [--skip_train] [--skip_gemma]
#                  [--skip_python] [-- extra collectives_bench flags]
#
# DIR defaults to build (what tools/build.sh builds). FILE defaults to
# bench/results/latest.json for a full run (the figures bench/README.md shows;
# the torch.distributed results go to python-latest.json beside it) and to
# DIR/bench_results.json with --quick, which runs every binary in its smoke
# mode (seconds; its numbers mean nothing). Every stage has a deadline; a stage
# that fails or times out is reported and recorded (rc), the others still
# run, and the script then exits 1.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# tpu_dist against Open MPI, MPICH, Intel MPI, DeepSpeed, Gloo and memcpy
# (installs the peers outside the project's venv first): bench/peers/run.py.
if [[ ${1:-} == peers ]]; then
  shift
  exec python3 "$repo/bench/peers/run.py" "$@"
fi
build="$repo/build"
out=""
quick=""
worlds="2 4 8 16"
py_worlds="2 4 16"
tvt_repeats=1
run_coll=1
run_p2p=1
run_train=1
run_gemma=1
run_python=1
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --quick) quick="--quick"; shift ;;
    --worlds) worlds="$2"; shift 2 ;;
    --py_worlds) py_worlds="$2"; shift 2 ;;
    --tvt_repeats) tvt_repeats="$2"; shift 2 ;;
    --skip_collectives) run_coll=0; shift ;;
    --skip_p2p) run_p2p=0; shift ;;
    --skip_train) run_train=0; shift ;;
    --skip_gemma) run_gemma=0; shift ;;
    --skip_python) run_python=0; shift ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
if [[ -z $out ]]; then
  if [[ -n $quick ]]; then out="$build/bench_results.json"; else out="$repo/bench/results/latest.json"; fi
fi
mkdir -p "$(dirname "$out")"
py_out="$(dirname "$out")/python-$(basename "$out")"
tmp="$(mktemp -d /tmp/tpud_bench_sh_XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

export OMP_NUM_THREADS=1
# Every stage has a deadline: a hung rank must not hang the driver.
deadline=900
parts=()
stages=()
failed=0
load1() { cut -d' ' -f1 /proc/loadavg; }
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"

# run_stage NAME FILTER LOG CMD...: runs CMD under the deadline with its
# stdout in LOG, prints the lines of LOG that the sed FILTER selects, and
# records the stage's wall time, load average before/after and exit status.
run_stage() {
  local name="$1" filter="$2" log="$3"; shift 3
  local lb t0 t1 rc
  lb="$(load1)"
  t0="$(date +%s.%N)"
  set +e
  timeout "$deadline" "$@" > "$log"
  rc=$?
  set -e
  t1="$(date +%s.%N)"
  sed -n "$filter" "$log"
  if [[ $rc != 0 ]]; then
    echo "bench.sh: stage $name failed (exit $rc; 124 = over ${deadline}s)" >&2
    failed=1
  fi
  stages+=("$(printf '{"stage": "%s", "seconds": %.1f, "load_before": %s, "load_after": %s, "rc": %d}' \
    "$name" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$lb" "$(load1)" "$rc")")
  return "$rc"
}

# text_part BENCH EXTRA_JSON LOG: a result that the binary prints as a table
# only (no JSON of its own): kept as text.
text_part() {
  jq -Rs --arg b "$1" --argjson x "$2" '{bench: $b} + $x + {text: .}' < "$3" \
    > "$3.json" && parts+=("$3.json")
}

if [[ $run_coll == 1 ]]; then
  for w in $worlds; do
    # Gloo on many ranks and large sizes takes seconds per op on 2 cores:
    # above 8 ranks compare with Gloo up to 16 MiB only.
    gloo_cap=()
    if [[ $w -gt 8 ]]; then gloo_cap=(--gloo_max_bytes=16777216); fi
    if run_stage "collectives_bench --world=$w" '/^== collectives/,$p' "$tmp/coll_w$w.log" \
        "$build/bench/collectives_bench" --world="$w" $quick "${gloo_cap[@]}" \
        --json_out="$tmp/coll_w$w.json" "${extra[@]}"; then
      parts+=("$tmp/coll_w$w.json")
    fi
  done
  if [[ -z $quick ]]; then
    # Multi-host path: 2 emulated hosts x 2 ranks (shm inside, TCP between).
    if run_stage "collectives_bench --world=4 --hosts=2" '/^== collectives/,$p' "$tmp/coll_h2.log" \
        "$build/bench/collectives_bench" --world=4 --hosts=2 \
        --json_out="$tmp/coll_w4_2hosts.json" "${extra[@]}"; then
      parts+=("$tmp/coll_w4_2hosts.json")
    fi
  fi
fi
if [[ $run_p2p == 1 && -x "$build/bench/p2p_bench" ]]; then
  for h in 1 2; do
    if run_stage "p2p_bench --hosts=$h" '/^== send/,$p' "$tmp/p2p_h$h.log" \
        "$build/bench/p2p_bench" --hosts="$h" $quick; then
      text_part p2p "{\"hosts\": $h}" "$tmp/p2p_h$h.log"
    fi
  done
fi
if [[ $run_coll == 1 && -x "$build/bench/reduce_kernels_bench" ]]; then
  if run_stage "reduce_kernels_bench" '/^== /,$p' "$tmp/kernels.log" \
      "$build/bench/reduce_kernels_bench" $quick; then
    text_part reduce_kernels '{}' "$tmp/kernels.log"
  fi
fi
if [[ $run_train == 1 && -x "$build/bench/train_bench" ]]; then
  for spec in "2 fp32" "4 fp32" "2 bf16"; do
    set -- $spec
    if run_stage "train_bench --world=$1 --fsdp_dtype=$2" '/^== train/,$p' "$tmp/train_w$1_$2.log" \
        "$build/bench/train_bench" --world="$1" --fsdp_dtype="$2" $quick \
        --json_out="$tmp/train_w$1_$2.json"; then
      parts+=("$tmp/train_w$1_$2.json")
    fi
  done
fi
if [[ $run_train == 1 && -x "$build/bench/train_vs_torch" ]]; then
  # Our FullyShard vs torch's Python FSDP2 + Gloo, same tiny Gemma.
  tvt_worlds=(2 4 16)
  [[ -n $quick ]] && tvt_worlds=(2)
  if run_stage "train_vs_torch.py" '1,$p' "$tmp/tvt.log" \
      "$repo/.venv/bin/python" "$repo/bench/python/train_vs_torch.py" $quick \
      --worlds "${tvt_worlds[@]}" --repeats "$tvt_repeats" --binary "$build/bench/train_vs_torch" \
      --json-out "$tmp/train_vs_torch.json"; then
    parts+=("$tmp/train_vs_torch.json")
  fi
fi
if [[ $run_gemma == 1 && -x "$build/bench/gemma_bench" ]]; then
  smoke=""
  [[ -n $quick ]] && smoke="--smoke"
  if run_stage "gemma_bench" '' "$tmp/gemma.log" \
      "$build/bench/gemma_bench" $smoke --benchmark_format=json \
      --benchmark_out="$tmp/gemma.json" --benchmark_out_format=json; then
    parts+=("$tmp/gemma.json")
  fi
fi
if [[ $run_python == 1 ]]; then
  # torch.distributed from Python: tpu_dist vs Gloo (needs the extension,
  # target tpu_dist_python). Its own files: python-<out>.{json,md}.
  if ! "$repo/.venv/bin/python" -c "import tpu_dist" 2> "$tmp/py_import.err"; then
    echo "bench.sh: skipping torch_dist_bench.py: $(tail -1 "$tmp/py_import.err")" >&2
  else
    py_load="$(cut -d' ' -f1-3 /proc/loadavg)"
    py_start="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    # shellcheck disable=SC2086
    if run_stage "torch_dist_bench.py --worlds $py_worlds" '1,$p' "$tmp/py.log" \
        "$repo/.venv/bin/python" "$repo/bench/python/torch_dist_bench.py" $quick \
        --worlds $py_worlds --json-out "$py_out"; then
      {
        echo "Run $py_start, bench/python/torch_dist_bench.py --worlds $py_worlds${quick:+ --quick};" \
          "$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(getconf _NPROCESSORS_ONLN) CPUs," \
          "load average $py_load at start, $(cut -d' ' -f1-3 /proc/loadavg) at end" \
          "(per world: the last column)."
        echo
        cat "$tmp/py.log"
      } > "${py_out%.json}.md"
      echo "python JSON: $py_out; markdown: ${py_out%.json}.md"
    fi
  fi
fi

isa="$(grep -m1 -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ' || true)"
commit="$(git -C "$repo" rev-parse --short HEAD 2> /dev/null || echo unknown)"
if [[ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2> /dev/null)" ]]; then
  commit="$commit+local changes"
fi
{
  printf '{"date": "%s", "commit": "%s", "machine": "%s", "isa": "%s", "cpus": %s, "quick": %s, ' \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$commit" \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "${isa% }" "$(getconf _NPROCESSORS_ONLN)" \
    "$([[ -n $quick ]] && echo true || echo false)"
  printf '"load_start": "%s", "load_end": "%s", "stages": [' "$load_start" "$(cut -d' ' -f1-3 /proc/loadavg)"
  sep=""
  for s in "${stages[@]}"; do printf '%s%s' "$sep" "$s"; sep=", "; done
  printf '], "results": ['
  sep=""
  for p in "${parts[@]}"; do printf '%s' "$sep"; cat "$p"; sep=","; done
  printf ']}\n'
} > "$out"
echo "JSON: $out"
# The markdown summary (what bench/README.md quotes): the run, each stage's
# time and load; every fp32 all_reduce, and every op/dtype at 8 B and 16 MiB;
# send/recv, the kernels, the training rows, train_vs_torch, gemma_bench.
jq -r '
  def f(x): if x == null then "-" else (x * 100 | round / 100 | tostring) end;
  def sz(b): if b >= 1048576 then "\(b / 1048576)MiB" elif b >= 1024 then "\(b / 1024)KiB"
             else "\(b)B" end;
  "Run \(.date), commit \(.commit // "?"), \(.machine) (\(.isa // "?")), \(.cpus) CPUs, load average \(.load_start // "?") at start, \(.load_end) at end\(if .quick then " (--quick: smoke sizes, not figures)" else "" end).\n",
  (if (.stages // []) != [] then
    "| stage | wall s | load before -> after | exit |", "|---|---|---|---|",
    (.stages[] | "| `\(.stage)` | \(.seconds) | \(.load_before) -> \(.load_after) | \(.rc) |"), ""
   else empty end),
  "| op | dtype | world | size | tpu_dist us | busBw GB/s | Gloo us | Gloo busBw | Gloo/tpu_dist | memcpy us | load before -> after |",
  "|---|---|---|---|---|---|---|---|---|---|---|",
  (.results[] | select(.bench == "collectives") | . as $c | .rows[]
   | select((.op == "all_reduce" and .dtype == "fp32") or .bytes == 8 or .bytes == 16777216)
   | "| \(.op) | \(.dtype) | \(.world)\(if ($c.hosts // 1) > 1 then " (\($c.hosts) hosts)" else "" end) | \(sz(.bytes)) | \(f(.time_us)) | \(f(.busbw_GBps)) | \(f(.gloo_time_us)) | \(f(.gloo_busbw_GBps)) | \(f(.speedup_vs_gloo)) | \(f(.memcpy_time_us)) | \(f($c.load_before)) -> \(f($c.load_after)) |"),
  "",
  (.results[] | select(.bench == "p2p" or .bench == "reduce_kernels")
   | "`\(.bench)`\(if .hosts then " --hosts=\(.hosts)" else "" end):\n\n```\n\(.text | sub("^[\\s\\S]*?(?=\n== )"; "") | ltrimstr("\n"))```\n"),
  "| train step (tpu_dist) | world | FSDP dtype | step ms | tokens/s | MFU vs bf16 GEMM | bf16 GEMM GFLOP/s | FSDP/DDP tokens/s |",
  "|---|---|---|---|---|---|---|---|",
  (.results[] | select(.bench == "train") | . as $t | .rows[]
   | "| \(.kind) | \($t.world) | \($t.fsdp_dtype) | \(f(.step_ms)) | \(f(.tokens_per_s)) | \(f(.mfu_vs_bf16_gemm * 100))% | \(f($t.gemm_bf16_GFLOPs)) | \(f($t.fsdp_over_ddp_tokens)) |"),
  "",
  (.results[] | select(.bench == "train_vs_torch")
   | "| train_vs_torch | world | ours tokens/s | torch FSDP2 tokens/s | ours/torch | by min step | torch/ours CPU per step | load before -> after |",
     "|---|---|---|---|---|---|---|---|",
     (.rows[] | "| repeat \(.repeat) | \(.world) | \(f(.ours.tokens_per_s)) | \(f(.torch.tokens_per_s)) | \(f(.ratio)) | \(f(.ratio_min)) | \(f(.ratio_cpu)) | \(.load_before) -> \(.load_after) |"),
     ""),
  (.results[] | select(.benchmarks != null)
   | "| gemma_bench case | wall ms | CPU ms | counters |", "|---|---|---|---|",
     (.benchmarks[] | "| \(.name) | \(f(.real_time)) | \(f(.cpu_time)) | \([to_entries[] | select((.value | type) == "number" and (.key | test("^(family_index|per_family_instance_index|repetitions|repetition_index|threads|iterations|real_time|cpu_time)$") | not)) | "\(.key) \(f(.value))"] | join(", ")) |"),
     "")
' "$out" > "${out%.json}.md" && echo "markdown: ${out%.json}.md"
# The plot: standard-library Python only (tools/plot_bench); skipped, not
# failed, where there is no python3 or no collectives rows.
if [[ $run_coll == 1 ]] && command -v python3 > /dev/null; then
  if python3 "$repo/tools/plot_bench" "$out" -o "${out%.json}.png"; then
    echo "plot: ${out%.json}.png"
  else
    echo "bench.sh: no plot (tools/plot_bench failed; the JSON and markdown are written)" >&2
  fi
else
  echo "bench.sh: no plot (no python3, or --skip_collectives)" >&2
fi
exit "$failed"
