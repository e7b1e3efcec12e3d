"""Old home of ``shard_dlrm`` and ``DistributedDLRM``, kept so that existing imports work: both now live in
``engine/dlrm/parallelize.py``, and ``build_sharded_dlrm`` is ``parallelize_dlrm`` under its former name."""

from __future__ import annotations

from haloflow.engine.dlrm.parallelize import DistributedDLRM, parallelize_dlrm, shard_dlrm

__all__ = ["DistributedDLRM", "shard_dlrm", "build_sharded_dlrm", "parallelize_dlrm"]

build_sharded_dlrm = parallelize_dlrm
