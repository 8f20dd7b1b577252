#!/usr/bin/env bash
# The README's test command: install what is missing, build, run every test.
# Extra arguments go to ctest (e.g. -L unit, -R collectives).
# Two tests at a time (cases labelled serial, the Ray cluster and other
# RUN_SERIAL entries still run alone): a full run on 2 cores, 2026-12-07,
# 444/444 in 2465 s against 2906-3100 s one at a time.
# TPU_DIST_TEST_JOBS=N changes it (1: one at a time).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/tools/install_deps.sh"
"$root/tools/build.sh"
cd "${BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 900 -j "${TPU_DIST_TEST_JOBS:-2}" "$@"
