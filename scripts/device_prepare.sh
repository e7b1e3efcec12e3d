#!/usr/bin/env bash
# Before the device check's call to a GPU machine (which reaches no network and does not see ../shared): copy the
# small data files the check reads into .devdata/ and download the wheels that machine lacks (pymetis, for its
# Python 3.12 on x86-64) into .whl/. Both folders are git-ignored: name them in the call's carry list, and
# scripts/device_check.sh picks them up there.
#
#   bash scripts/device_prepare.sh          # then, on the GPU machine: bash scripts/device_check.sh OUT
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
data=${HALOFLOW_DATA:-$root/../shared/data}
py=${PYTHON:-$root/.venv/bin/python}
for d in planetoid temporal criteo; do
    if [ ! -d "$data/$d" ]; then
        echo "device_prepare: $data/$d is missing (set HALOFLOW_DATA to the data folder)" >&2
        exit 2
    fi
done
rm -rf "$root/.devdata" && mkdir -p "$root/.devdata"
for d in planetoid temporal criteo; do cp -r "$data/$d" "$root/.devdata/"; done
rm -rf "$root/.whl"  # one version of each wheel: two would stop the install there
version=$("$py" -c "import importlib.metadata as m; print(m.version('pymetis'))")
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$root/.whl" "pymetis==$version"
du -sh "$root/.devdata" "$root/.whl"
