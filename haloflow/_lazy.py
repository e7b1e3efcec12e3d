"""Package attributes imported on first use, so that importing a package does not import torch or pyarrow.

::

    _LAZY = {"train_dlrm": "haloflow.engine.dlrm.train"}   # name -> module that defines it
    __getattr__ = lazy_getattr(__name__, _LAZY)
    __all__ += list(_LAZY)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, names: dict[str, str]) -> Callable[[str], object]:
    """A module-level ``__getattr__`` for ``package`` that imports ``names[name]`` and returns its ``name``."""

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
