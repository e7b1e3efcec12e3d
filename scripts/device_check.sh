#!/usr/bin/env bash
# The device check on a GPU machine: every GPU path of haloflow run and measured, in one command (about 6 minutes on
# one H200). See haloflow/bench/device/check.py for the parts.
#
#   bash scripts/device_check.sh OUT [--parts a,b] [--total-s S]    on the GPU machine, from a checkout
#   bash scripts/device_check.sh OUT --device cpu --tiny             a dry run here
#
# It uses the machine's python3 (its own torch with CUDA; nothing is installed from a registry). Wheels in .whl/
# (pymetis, for instance, where the machine lacks it) are installed into a temporary folder first, and data in
# .devdata/ (a copy of ../shared/data's small files) is used when HALOFLOW_DATA is not set (scripts/device_prepare.sh
# makes both). OUT receives summary.md,
# summary.json and device_check.tar.gz (every part's json, md and log); the parts work in OUT/../device_check-work.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: bash scripts/device_check.sh OUT [--device cpu --tiny] [--parts a,b] [--total-s S]" >&2
    exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd); shift  # absolute: the check runs from the repository root
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
if compgen -G "$root/.whl/*.whl" >/dev/null; then
    if "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/haloflow-site "$root"/.whl/*.whl; then
        export PYTHONPATH=/tmp/haloflow-site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "device_check: the wheels in .whl/ do not install for $py; going on without them" >&2
    fi
fi
export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
if [ -z "${HALOFLOW_DATA:-}" ] && [ -d "$root/.devdata" ]; then
    export HALOFLOW_DATA=$root/.devdata
fi
export PYTHONUNBUFFERED=1
work=$(cd "$out/.." && pwd)/device_check-work
cd "$root"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
exec "$py" -m haloflow.bench.device.check --out "$out" --work "$work" "$@"
