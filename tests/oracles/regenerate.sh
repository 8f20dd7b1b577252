#!/usr/bin/env bash
# Regenerates every oracle fixture under tests/oracles/fixtures/ (or under
# $1 when given) with the project venv's pinned transformers / tokenizers /
# torch. Deterministic: fixed seeds, one thread; test_fixtures_fresh.py
# checks that a fresh run reproduces the committed files exactly on a CPU
# with the committed cpu.json's kernel flags. ctest's oracle_fixtures entry
# runs this into the build tree so the C++ oracle tests compare against
# transformers / torch run on the same CPU (TPU_DIST_ORACLE_FIXTURES).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
out="${1:-${here}/fixtures}"
python="${PYTHON:-${repo}/.venv/bin/python}"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONHASHSEED=0 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
mkdir -p "${out}"
# TPU_DIST_ORACLE_CACHE=DIR (ctest's oracle_fixtures sets it): reuse a set
# made before from exactly the same inputs, as ccache reuses an
# object file; otherwise make it and keep a copy there. Inputs: these
# scripts, data/ (the tiny model and instructions they read), the pinned
# requirements, the interpreter, this CPU's kernel tag. The values are those
# a fresh run makes (the scripts are deterministic: test_fixtures_fresh.py).
cache=""
if [[ -n "${TPU_DIST_ORACLE_CACHE:-}" ]]; then
  key="$( { cat "${here}"/*.py "${here}/regenerate.sh" "${repo}/requirements.txt" \
              "${repo}/requirements-lock.txt";
            find "${repo}/data" -type f | LC_ALL=C sort | xargs sha256sum | sed "s|${repo}/||"
            "${python}" -c 'import sys; print(sys.version)';
            "${python}" "${here}/cpu_tag.py" /dev/stdout; } | sha256sum | cut -c1-24)"
  cache="${TPU_DIST_ORACLE_CACHE}/${key}"
  if [[ -f "${cache}/.complete" ]]; then
    cp -r "${cache}/." "${out}/"
    rm -f "${out}/.complete"
    echo "regenerate.sh: oracle fixtures from the cache ${cache} (same inputs)"
    exit 0
  fi
fi
"${python}" "${here}/make_gemma_fixtures.py" --out "${out}/gemma"
"${python}" "${here}/make_tokenizer_fixtures.py" --out "${out}/tokenizer"
"${python}" "${here}/fsdp2_gemma_oracle.py" --out "${out}/fsdp2"
"${python}" "${here}/dtensor_oracle.py" --out "${out}/dtensor"
"${python}" "${here}/hsdp_oracle.py" --out "${out}/hsdp"
"${python}" "${here}/hsdp_gemma_oracle.py" --out "${out}/hsdp_gemma"
# The kernel path these floats are exact for (see cpu_tag.py).
# The CPU tag: of the whole set, and of each folder (test_fixtures_fresh.py
# judges each folder by its own; a folder regenerated alone on another CPU
# keeps the tag of the machine that made it).
"${python}" "${here}/cpu_tag.py" "${out}/cpu.json"
for d in gemma tokenizer fsdp2 dtensor hsdp hsdp_gemma; do
  cp "${out}/cpu.json" "${out}/${d}/cpu.json"
done
if [[ -n "${cache}" ]]; then
  # Written aside, then renamed: a run stopped half-way leaves no entry.
  mkdir -p "${TPU_DIST_ORACLE_CACHE}"
  tmp="$(mktemp -d "${TPU_DIST_ORACLE_CACHE}/.tmp.XXXXXX")"
  cp -r "${out}/." "${tmp}/" && touch "${tmp}/.complete" && mv -T "${tmp}" "${cache}" 2>/dev/null \
    || rm -rf "${tmp}"
  echo "regenerate.sh: kept a copy in ${cache}"
fi
