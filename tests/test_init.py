import importlib
import subprocess
import sys

import pytest

PACKAGES = ["haloflow", "haloflow.data", "haloflow.models", "haloflow.partition", "haloflow.partition.planner",
            "haloflow.engine", "haloflow.utils"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves(package):
    module = importlib.import_module(package)
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        module.nope  # noqa: B018


def test_graph_side_imports_neither_torch_nor_pyarrow():
    code = "import sys, haloflow, haloflow.data, haloflow.partition; print('torch' in sys.modules, 'pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
