"""Distributed TGN: node memory owned by partition (``memory.py``) and the training loop (``train.py``)."""
