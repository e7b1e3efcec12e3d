"""FixedFractionReservation: keep a fixed share of every rank's memory away from the embedding tables.

What the tables may use on rank r = ``memory_per_rank[r] * (1 - fraction)``; the rest is for the dense MLPs,
activations and all-to-all buffers, which the planner does not model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from haloflow.errors import ConfigError
from haloflow.partition.planner.types import StorageReservation, TableSpec, Topology

__all__ = ["FixedFractionReservation"]


@dataclass(frozen=True, kw_only=True)
class FixedFractionReservation(StorageReservation):
    """Args:
    fraction: share of each rank's budget held back, in [0, 1) (0: the budget given is for tables alone).
    """

    fraction: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction < 1.0:
            raise ConfigError(f"reserved fraction must be in [0, 1), got {self.fraction}")

    def reserve(self, topology: Topology, tables: tuple[TableSpec, ...]) -> Topology:
        left = tuple(m * (1.0 - self.fraction) for m in topology.memory_per_rank)
        return dataclasses.replace(topology, memory_per_rank=left)
