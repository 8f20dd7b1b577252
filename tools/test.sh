#!/usr/bin/env bash
# The README's test command: install what is missing, build, run every test.
# Extra arguments go to ctest (e.g. -L unit, -R collectives).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/tools/install_deps.sh"
"$root/tools/build.sh"
cd "${BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 900 "$@"
