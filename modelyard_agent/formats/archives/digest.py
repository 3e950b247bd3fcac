"""SHA-256 of a file on disk, in constant memory."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path, chunk_size: int = 1 << 20) -> tuple[str, int]:
    """Hash a file with SHA-256 in constant memory.

    Args:
        path: the file to read.
        chunk_size: bytes read per step; memory use is bounded by it.

    Returns:
        ``(hex digest, size in bytes)``.

    Raises:
        ValueError: ``chunk_size`` is not positive.
        OSError: the file cannot be read.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, not {chunk_size}")
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    with open(path, "rb") as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            size += count
    return digest.hexdigest(), size
