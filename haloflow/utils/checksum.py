"""CRC-32 of a file, read in blocks (partition folders and checkpoints record one per file)."""

from __future__ import annotations

import os
import zlib

__all__ = ["crc32_file"]

_BLOCK = 1 << 22  # bytes read per step


def crc32_file(path: str | os.PathLike) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            crc = zlib.crc32(block, crc)
    return crc
