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
