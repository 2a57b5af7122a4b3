#!/usr/bin/env bash
# The Python environment of the baseline scripts (tools/baselines/*.py, tools/speed_table.py,
# tools/torch_crosscheck.py): a venv with torch, numpy and safetensors, plus mpi4py when
# Open MPI is installed (for allreduce_mpi.py).
#
#   bash tools/baselines/setup.sh
#
# The venv goes to $NANODDP_BASELINES_VENV, by default
# ${XDG_CACHE_HOME:-$HOME/.cache}/nanoddp-baselines/venv (outside the repository: it is large),
# made with $PYTHON (default python3). The scripts find it there by themselves.
# Re-running is cheap: what is already installed is kept, and the versions are printed.
#
# Size: on x86-64 Linux, PyPI's torch wheel is the CUDA build (no CPU-only torch is published
# on PyPI), about 2.3 GB to download and 5.4 GB installed; the CUDA libraries are loaded but
# never used by these CPU scripts. Set NANODDP_TORCH to install another requirement instead of
# `torch` (for example a CPU wheel from PyTorch's own index, with PIP_INDEX_URL / PIP_EXTRA_INDEX_URL).
#
# Outside the venv, from the system (this script reports them; it installs nothing there):
#   Fashion-MNIST, for torch_lenet.py and torch_crosscheck.py   apt-get install dataset-fashion-mnist
#   Open MPI, for allreduce_mpi.py                               apt-get install openmpi-bin libopenmpi-dev
set -euo pipefail

VENV="${NANODDP_BASELINES_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/nanoddp-baselines/venv}"
PYTHON="${PYTHON:-python3}"
TORCH="${NANODDP_TORCH:-torch}"

packages=("$TORCH" numpy safetensors)
imports="import torch, numpy, safetensors"
if command -v mpirun >/dev/null 2>&1; then
  packages+=(mpi4py)
  imports+=", mpi4py"
  have_mpi=1
else
  have_mpi=0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "$imports" 2>/dev/null; then
  echo "installing ${packages[*]} (torch is large: minutes on a first run)"
  start=$(date +%s)
  "$VENV/bin/python" -m pip install -q "${packages[@]}"
  echo "pip install took $(( $(date +%s) - start )) s; the venv holds $(du -sh "$VENV" | cut -f1)"
fi

"$VENV/bin/python" - <<'PY'
import platform
import numpy, safetensors, torch
line = (f"python {platform.python_version()}, torch {torch.__version__}, numpy {numpy.__version__}, "
        f"safetensors {safetensors.__version__}")
try:
    import mpi4py
    from mpi4py import MPI
    library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
    line += f", mpi4py {mpi4py.__version__} ({library})"
except ImportError:
    pass
print(line)
PY
if [ "$have_mpi" = 0 ]; then
  echo "note: no mpirun on PATH, so no mpi4py: allreduce_mpi.py needs Open MPI" \
       "(apt-get install openmpi-bin libopenmpi-dev), then run this script again"
fi

data=""
for dir in "${NANODDP_DATA:-}" /usr/share/datasets/fashion-mnist ./data/fashion-mnist; do
  if [ -n "$dir" ] && [ -f "$dir/train-images-idx3-ubyte.gz" ]; then data=$dir; break; fi
done
if [ -n "$data" ]; then
  echo "Fashion-MNIST: $data"
else
  echo "note: Fashion-MNIST not found (\$NANODDP_DATA, /usr/share/datasets/fashion-mnist," \
       "./data/fashion-mnist): apt-get install dataset-fashion-mnist, or set NANODDP_DATA"
fi
echo "venv ready: $VENV/bin/python"
