"""The one registry of model families: what the CLI, ``haloflow`` and ``haloflow.engine`` read to know them.

A family is one module ``haloflow/engine/<name>/train.py`` holding a ``Family`` for ``engine/trainer.py``'s loop
and a ``train_<name>(config)`` entry point, one config module ``haloflow/engine/<name>/config.py``, and one CLI
module ``haloflow/cli/train_<name>.py``; after training, ``haloflow/engine/<name>/predict.py`` holds
``predict_<name>``, its config and ``export_tensors`` (the checkpoint as the single-device model's tensors, what
``haloflow export`` writes). Adding a family is adding those files and one line to ``FAMILIES``::

    name   config class       entry point    CLI module                  unit
    gcn    GCNTrainConfig     train_gcn      haloflow.cli.train_gcn      epoch
    dlrm   DLRMTrainConfig    train_dlrm     haloflow.cli.train_dlrm     step
    tgn    TGNTrainConfig     train_tgn      haloflow.cli.train_tgn      batch

Nothing here imports torch: the names are module paths, imported on first use.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FamilyEntry", "FAMILIES", "lazy_names", "titles"]


@dataclass(frozen=True)
class FamilyEntry:
    """Where a family's pieces live (module paths, so that reading the registry imports nothing heavy)."""

    name: str  # "gcn": the CLI's `haloflow train gcn`, the checkpoint kind
    title: str  # "GCN": how people name it in help and summaries
    help: str  # one line for `haloflow train --help`
    config: str  # the config class's name, in haloflow.engine.<name>.config
    result: str  # the result class's name, in haloflow.engine.<name>.train
    predict_config: str  # the scoring config's name, in haloflow.engine.<name>.predict (with predict_<name>)

    @property
    def entry_point(self) -> str:
        return f"train_{self.name}"

    @property
    def train_module(self) -> str:
        return f"haloflow.engine.{self.name}.train"

    @property
    def predict_entry_point(self) -> str:
        return f"predict_{self.name}"

    @property
    def predict_module(self) -> str:
        """Where ``predict_<name>``, its config and ``export_tensors`` (what ``haloflow export`` writes) live."""
        return f"haloflow.engine.{self.name}.predict"

    @property
    def config_module(self) -> str:
        return f"haloflow.engine.{self.name}.config"

    @property
    def cli_module(self) -> str:
        return f"train_{self.name}"  # under haloflow.cli


FAMILIES: dict[str, FamilyEntry] = {e.name: e for e in (
    FamilyEntry("gcn", "GCN", "full-batch GCN / GraphSAGE on a graph or its partition folder", "GCNTrainConfig",
                "GCNTrainResult", "GCNPredictConfig"),
    FamilyEntry("dlrm", "DLRM", "DLRM on click logs, tables sharded by a plan", "DLRMTrainConfig", "DLRMTrainResult",
                "DLRMPredictConfig"),
    FamilyEntry("tgn", "TGN", "memory-based temporal GNN (TGN) on an event stream", "TGNTrainConfig",
                "TGNTrainResult", "TGNPredictConfig"),
)}


def lazy_names() -> dict[str, str]:
    """name -> module for every family's entry point, config, result and predict_<name> with its config, and the
    export's names (a package's ``_LAZY`` table)."""
    names: dict[str, str] = {}
    for e in FAMILIES.values():
        names[e.entry_point] = e.train_module
        names[e.result] = e.train_module
        names[e.config] = e.config_module
        names[e.predict_entry_point] = e.predict_module
        names[e.predict_config] = e.predict_module
    for name in ("ExportConfig", "export_model", "load_model"):
        names[name] = "haloflow.engine.export"
    return names


def titles() -> str:
    """"GCN, DLRM and TGN": the families as a person reads them (help texts)."""
    t = [e.title for e in FAMILIES.values()]
    return t[0] if len(t) == 1 else f"{', '.join(t[:-1])} and {t[-1]}"
