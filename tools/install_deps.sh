#!/usr/bin/env bash
# Installs what this project needs, only what is missing:
#   1. the Debian 12 packages (apt), and
#   2. the project virtualenv .venv/ from requirements.txt pinned by
#      requirements-lock.txt: the torch 2.x wheel whose libtorch the C++ build
#      links, transformers, tokenizers, ray, pybind11, pytest.
# Safe to run repeatedly: a second run installs nothing. Needs root (or sudo)
# only when a Debian package is missing. PYTHON picks the interpreter the venv
# is made from (default: python3, which must be >= 3.11).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libgloo-dev
  libabsl-dev libssl-dev openssl
  libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libsentencepiece-dev
  iproute2 procps jq
  clang-14 libclang-rt-14-dev llvm-14   # libFuzzer, sanitizers, llvm-symbolizer: tools/fuzz.sh;
                                        # -Wthread-safety: tools/thread_safety_check.py
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} Debian packages present"
else
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- the project virtualenv -------------------------------------------------
venv="$root/.venv"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "install_deps: $python is missing or older than 3.11 (torch 2.15 needs >= 3.11); set PYTHON=" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "install_deps: creating $venv from $("$python" --version 2>&1)"
  "$python" -m venv "$venv"
fi
# The stamp is the hash of the pins: unchanged pins, nothing to do.
stamp="$(cat "$root/requirements.txt" "$root/requirements-lock.txt" "$root/python/pyproject.toml" \
  | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$venv/.tpu_dist_requirements" 2>/dev/null || true)" = "$stamp" ]; then
  echo "install_deps: venv up to date ($venv)"
else
  echo "install_deps: installing requirements.txt into $venv (torch wheel ~0.5 GB + CUDA runtime wheels; cached by pip)"
  "$venv/bin/pip" install --disable-pip-version-check --progress-bar off -q \
    -r "$root/requirements.txt" -c "$root/requirements-lock.txt"
  # Our own package, editable: `import tpu_dist` loads python/tpu_dist and the
  # extension tools/build.sh builds into it.
  "$venv/bin/pip" install --disable-pip-version-check -q --no-deps --no-build-isolation \
    -e "$root/python"
  echo "$stamp" > "$venv/.tpu_dist_requirements"
fi
