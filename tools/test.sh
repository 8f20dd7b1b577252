#!/usr/bin/env bash
# The README's test command: install what is missing, build, run every test.
# Extra arguments go to ctest (e.g. -L unit, -R collectives).
# TPU_DIST_TEST_JOBS=2 runs two tests at a time (cases labelled serial still
# run alone); the default stays one at a time until a full -j2 run is proven
# on CI.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/tools/install_deps.sh"
"$root/tools/build.sh"
cd "${BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 900 -j "${TPU_DIST_TEST_JOBS:-1}" "$@"
