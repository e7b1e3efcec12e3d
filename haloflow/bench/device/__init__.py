"""The device check: every GPU path of haloflow run and measured on one machine (``scripts/device_check.sh``).

``check`` runs the parts, each a module with ``main(argv) -> int`` built on ``common``: ``cuda_check``,
``train_parity``, ``gcn_gpu``, ``dlrm_gpu``, ``cache_gpu``, ``tgn_gpu``, ``cpu_scaling``.
"""
