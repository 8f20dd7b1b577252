#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, no libtorch)
# into ${FUZZ_BUILD_DIR:-build-fuzz} and runs each for a bounded time on a
# copy of its seed corpus (fuzz/corpus/<target>/), after replaying every saved
# crash (fuzz/regressions/<target>/). Exits 1 if any target crashed, leaked,
# hung (-timeout) or ran out of memory (-rss_limit_mb), printing where the
# input was saved. fuzz/README.md has the details.
# Usage: tools/fuzz.sh [seconds_per_target (60)] [target...]
#   FUZZ_CXX / FUZZ_CC   the compilers (clang++-14 / clang-14)
#   FUZZ_OUT_DIR         where runs leave corpora, logs and crash inputs
#                        (default build-fuzz/runs; emptied per target)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
out="${FUZZ_OUT_DIR:-$build/runs}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-5G}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"

mkdir -p "$build"
exec 9>"$build/.tpu_dist_build.lock"
if ! flock -n 9; then
  echo "fuzz.sh: another build holds $build/.tpu_dist_build.lock; waiting" >&2
  flock 9
fi
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPU_DIST_FUZZ=ON \
    -DCMAKE_C_COMPILER="${FUZZ_CC:-clang-14}" -DCMAKE_CXX_COMPILER="${FUZZ_CXX:-clang++-14}"
fi
cmake --build "$build" -j "${BUILD_JOBS:-2}"
exec 9>&-

if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for d in "$root"/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi

# Leaks are crashes too; symbolized reports need llvm-symbolizer.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && [ -x /usr/lib/llvm-14/bin/llvm-symbolizer ]; then
  export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer
fi

failed=()
for t in "${targets[@]}"; do
  bin="$build/fuzz/$t"
  work="$out/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/crashes"
  cp "$root/fuzz/corpus/$t/"* "$work/corpus/"
  # 1. every past crash, once each.
  regressions=("$root/fuzz/regressions/$t/"*)
  if [ -e "${regressions[0]}" ]; then
    if ! "$bin" -timeout=10 -rss_limit_mb=2048 "${regressions[@]}" > "$work/regressions.log" 2>&1; then
      echo "fuzz.sh: $t: a saved regression input fails again; see $work/regressions.log" >&2
      tail -n 40 "$work/regressions.log" >&2
      failed+=("$t")
      continue
    fi
  fi
  # 2. bounded fuzzing from the seeds.
  dict=()
  if [ -f "$root/fuzz/$t.dict" ]; then dict=(-dict="$root/fuzz/$t.dict"); fi
  echo "fuzz.sh: $t for ${seconds}s"
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$work/crashes/" "${dict[@]}" "$work/corpus" > "$work/fuzz.log" 2>&1; then
    # The last status line: "#runs DONE cov: .. ft: .. corp: .. exec/s: ..".
    grep -E '^#[0-9]+' "$work/fuzz.log" | tail -n 1 | sed "s/^/  $t: /"
  else
    failed+=("$t")
    echo "fuzz.sh: $t FAILED; its report:" >&2
    grep -m1 -B2 -A30 -E '==ERROR|FUZZ_CHECK|runtime error|deadly signal|Timeout|out-of-memory|leak' \
      "$work/fuzz.log" >&2 || tail -n 40 "$work/fuzz.log" >&2
    for a in "$work/crashes/"*; do
      [ -e "$a" ] && echo "fuzz.sh: $t: input saved at $a (replay: $bin $a; keep it: cp $a $root/fuzz/regressions/$t/)" >&2
    done
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]} (logs under $out)" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets, ${seconds}s each, no crash (logs under $out)"
