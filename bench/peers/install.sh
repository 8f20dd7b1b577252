#!/usr/bin/env bash
# Installs the peers that bench/peers/run.py times, outside the project's
# environment, and builds our MPI benchmark against each MPI:
#   - Open MPI and MPICH: Debian packages at the versions of apt-packages.txt
#     (apt-get; skipped when those versions are already installed);
#   - Intel MPI (impi-rt + impi-devel) and DeepSpeed: PyPI, the pins of
#     requirements.txt, into a scratch venv ($PEERS_DIR/venv) that sees the
#     project's torch through a .pth file (pip --no-deps --no-build-isolation:
#     no second torch);
#   - $PEERS_DIR/bin/mpi_peers_{openmpi,mpich,impi} (mpi_peers.c compiled by
#     each MPI's mpicc) and mpi_peers_memcpy (the same file without MPI).
#
#   bench/peers/install.sh [--skip_apt] [--skip_pip]
#
# PEERS_DIR defaults to ~/.cache/tpu_dist/peers. Prints one line per peer:
# its version, or why it is missing; exits 0 when at least one MPI built.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
peers="${PEERS_DIR:-$HOME/.cache/tpu_dist/peers}"
skip_apt=0
skip_pip=0
for a in "$@"; do
  case "$a" in
    --skip_apt) skip_apt=1 ;;
    --skip_pip) skip_pip=1 ;;
    *) echo "install.sh: unknown flag $a" >&2; exit 2 ;;
  esac
done
mkdir -p "$peers/bin"
log="$peers/install.log"
: > "$log"

apt_pkgs=($(grep -v '^#' "$here/apt-packages.txt"))
if [[ $skip_apt == 0 ]]; then
  missing=()
  for p in "${apt_pkgs[@]}"; do
    have="$(dpkg-query -W -f='${Version}' "${p%%=*}" 2> /dev/null || true)"
    [[ "$have" == "${p#*=}" ]] || missing+=("$p")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    echo "install.sh: apt-get install ${missing[*]}"
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}"; } >> "$log" 2>&1 || echo "install.sh: apt-get failed (see $log)" >&2
  fi
fi

venv="$peers/venv"
py="$repo/.venv/bin/python"
if [[ $skip_pip == 0 ]]; then
  if [[ ! -x "$venv/bin/python" ]]; then
    "$py" -m venv "$venv" >> "$log" 2>&1 || echo "install.sh: venv failed (see $log)" >&2
  fi
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  proj_site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  # The project's packages (torch, tpu_dist's editable install) after the
  # scratch venv's own: addsitedir also runs the .pth files there.
  echo "import site; site.addsitedir('$proj_site')" > "$site/zz_tpu_dist_project_venv.pth"
  # wheel first: building DeepSpeed's sdist without isolation needs it.
  { "$venv/bin/python" -m pip install --no-deps -q "$(grep '^wheel==' "$here/requirements.txt")" &&
    "$venv/bin/python" -m pip install --no-deps --no-build-isolation -q \
      -r "$here/requirements.txt"; } >> "$log" 2>&1 \
    || echo "install.sh: pip install failed (see $log)" >&2
fi

# DeepSpeed's shm all-reduce op is JIT-built on first use (about a minute on
# 2 cores): build it now, into the scratch dir (run.py points
# TORCH_EXTENSIONS_DIR there too).
if [[ -x "$venv/bin/python" ]]; then
  TORCH_EXTENSIONS_DIR="$peers/torch_extensions" DS_ACCELERATOR=cpu "$venv/bin/python" -c '
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("ShareMemCommBuilder").load()' >> "$log" 2>&1 \
    || echo "install.sh: DeepSpeed shm op not built (see $log)" >&2
fi

cflags=(-O2 -std=c11 -Wall)
cc -O2 -std=c11 -Wall -pthread -DPEERS_MEMCPY_ONLY -o "$peers/bin/mpi_peers_memcpy" "$here/mpi_peers.c" \
  >> "$log" 2>&1 || echo "install.sh: memcpy build failed (see $log)" >&2
built=0
build() {  # build NAME MPICC [env...]
  local name="$1" mpicc="$2"; shift 2
  if env "$@" "$mpicc" "${cflags[@]}" -o "$peers/bin/mpi_peers_$name" "$here/mpi_peers.c" >> "$log" 2>&1; then
    built=1
  else
    echo "install.sh: mpi_peers_$name not built (see $log)" >&2
    rm -f "$peers/bin/mpi_peers_$name"
  fi
}
command -v mpicc.openmpi > /dev/null && build openmpi mpicc.openmpi
command -v mpicc.mpich > /dev/null && build mpich mpicc.mpich
if [[ -x "$venv/bin/mpicc" ]]; then
  build impi "$venv/bin/mpicc" I_MPI_ROOT="$venv" I_MPI_CC=cc
fi

# What is there: one line per peer.
echo "peers in $peers:"
v() { dpkg-query -W -f='${Version}' "$1" 2> /dev/null || echo "not installed"; }
echo "  Open MPI  $(v openmpi-bin)  $( [[ -x $peers/bin/mpi_peers_openmpi ]] && echo built || echo 'NOT built')"
echo "  MPICH     $(v mpich)  $( [[ -x $peers/bin/mpi_peers_mpich ]] && echo built || echo 'NOT built')"
pipv() { "$venv/bin/python" -m pip show "$1" 2> /dev/null | sed -n 's/^Version: //p'; }
echo "  Intel MPI $(pipv impi-rt || true)  $( [[ -x $peers/bin/mpi_peers_impi ]] && echo built || echo 'NOT built')"
ds="$("$venv/bin/python" -c 'import deepspeed; print(deepspeed.__version__)' 2>> "$log" | tail -1)"; ds="${ds:-NOT importable}"
echo "  DeepSpeed $ds"
[[ $built == 1 ]]
