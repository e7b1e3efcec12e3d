#!/usr/bin/env bash
# Build the benchmarks' peers in virtual environments of their own (their torch builds conflict with ours):
#   dgl       DGL 2.1.0 on torch 2.2.1 (DGL's wheels stop at torch 2.2)       -> `haloflow bench gcn` row "dgl"
#   torchrec  TorchRec 1.9.2 + fbgemm-gpu-cpu 1.9.0 on torch 2.14.1           -> `haloflow bench dlrm` row "torchrec"
# Each takes a few GB and a few minutes; the benchmarks find them under $HALOFLOW_PEERS (default
# ~/.cache/haloflow-peers), or take --dgl-python / --torchrec-python. Not part of the test setup.
#   bash scripts/setup_peers.sh            # both
#   bash scripts/setup_peers.sh dgl        # one
set -euo pipefail
PY=${PYTHON:-python3}
DIR=${HALOFLOW_PEERS:-$HOME/.cache/haloflow-peers}
PIP=(-m pip install -q --disable-pip-version-check)
mkdir -p "$DIR"

venv() {  # a fresh venv at $DIR/$1 (venvs hard-code their own path, so it is built where it stays)
  rm -rf "$DIR/$1" && "$PY" -m venv "$DIR/$1"
}

build_dgl() {
  venv dgl
  local p="$DIR/dgl/bin/python"
  "$p" "${PIP[@]}" "torch==2.2.1" "numpy<2" "setuptools<70"
  # numpy<2 again: pandas and scipy would otherwise pull numpy 2, which torch 2.2's C extension cannot load
  "$p" "${PIP[@]}" "dgl==2.1.0" "torchdata<0.8" "numpy<2" pandas pyyaml pydantic psutil requests tqdm networkx scipy
  # torch only warns when its numpy bridge fails to load; from_numpy makes that an error here
  DGLBACKEND=pytorch "$p" -c "import dgl, numpy, torch; torch.from_numpy(numpy.zeros(1)); \
print('dgl', dgl.__version__, 'torch', torch.__version__, 'numpy', numpy.__version__)"
  echo "peer dgl: $p"
}

build_torchrec() {
  venv torchrec
  local p="$DIR/torchrec/bin/python"
  "$p" "${PIP[@]}" "torch==2.14.1" numpy
  "$p" "${PIP[@]}" "fbgemm-gpu-cpu==1.9.0"
  "$p" "${PIP[@]}" --no-deps "torchrec==1.9.2"
  "$p" "${PIP[@]}" tensordict "torchmetrics==1.0.3" tqdm pyre-extensions iopath
  "$p" -c "import torchrec, torch; print('torchrec', torchrec.__version__, 'torch', torch.__version__)"
  echo "peer torchrec: $p"
}

for peer in "${@:-dgl torchrec}"; do
  for one in $peer; do
    case "$one" in
      dgl) build_dgl ;;
      torchrec) build_torchrec ;;
      *) echo "setup_peers.sh: unknown peer '$one'; expected dgl or torchrec" >&2; exit 2 ;;
    esac
  done
done
