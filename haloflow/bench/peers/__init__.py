"""Peer workers: scripts run under a peer library's own Python (``haloflow.bench.peer``), never imported here."""
