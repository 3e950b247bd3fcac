"""Extracting the version directory of an inspected Triton model archive, member by member, safely."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from modelyard_agent.formats.archives.layout import TritonModelLayout
from modelyard_agent.formats.archives.limits import ArchiveError, ArchiveLimits, _reading, _show
from modelyard_agent.formats.archives.members import _copy_member, _Entry, _scan
from modelyard_agent.formats.archives.readers import _open_reader, _Reader


def extract_version_dir(path: Path, layout: TritonModelLayout, dest: Path, limits: ArchiveLimits) -> int:
    """Extract the regular files of the version directory into a new directory.

    ``dest`` receives the contents of the version directory (``dest/model.onnx`` for the member
    ``<model_root>1/model.onnx``). Files are written 0o644 and directories 0o755 whatever the
    archive says; links are never followed or created; data is streamed in 1 MiB chunks. Every
    member is checked again while reading, so an archive replaced since :func:`inspect_triton_archive`
    is refused rather than trusted.

    Args:
        path: the archive file on local disk, as given to :func:`inspect_triton_archive`.
        layout: what :func:`inspect_triton_archive` returned for this archive.
        dest: the directory to create; it must not exist yet, and its parent must.
        limits: the same bounds as for inspection; the bytes actually written are checked against
            ``max_unpacked_bytes`` as they are written.

    Returns:
        The number of bytes written, in total.

    Raises:
        ArchiveError: anything wrong with the archive, including data that outgrows its declared
            size, a running total over ``max_unpacked_bytes``, truncation, or content that no
            longer matches ``layout``. ``dest`` has been removed completely.
        FileExistsError: ``dest`` already exists; it is left untouched.
        FileNotFoundError: the parent of ``dest`` or the archive does not exist.
        OSError: a local write failed (for example, the disk is full); ``dest`` has been removed.
            Kept apart from ArchiveError because a retry may succeed and the upload is not at fault.

    Not idempotent by itself: a second call with the same ``dest`` raises FileExistsError, so a
    caller that retries extracts into a fresh directory (or removes the old one first).
    """
    path = Path(path)
    dest = Path(dest)
    archive_bytes = path.stat().st_size
    os.mkdir(dest, 0o755)
    try:
        os.chmod(dest, 0o755)
        return _extract_into(path, layout, dest, limits, archive_bytes)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise


def _extract_into(path: Path, layout: TritonModelLayout, dest: Path, limits: ArchiveLimits, archive_bytes: int) -> int:
    prefix = (*(part for part in layout.model_root.split("/") if part), layout.version_dir)
    expected = set(layout.files)
    written: set[str] = set()
    made_dirs: set[tuple[str, ...]] = set()
    total = 0
    with _open_reader(path) as reader:
        if reader.kind != layout.kind:
            raise ArchiveError(f"archive changed since it was inspected: it is now a {reader.kind} archive")
        for entry in _scan(reader, limits, archive_bytes):
            if entry.ignored or entry.is_dir or entry.parts[: len(prefix)] != prefix:
                continue
            rel_parts = entry.parts[len(prefix) :]
            rel = "/".join(rel_parts)
            if rel not in expected:
                raise ArchiveError(f"archive changed since it was inspected: member {entry.shown} is new")
            if rel in written:
                raise ArchiveError(f"member {entry.shown} appears more than once")
            written.add(rel)
            parent = _make_parents(dest, rel_parts[:-1], made_dirs)
            total += _write_member(reader, entry, parent / rel_parts[-1], limits, total, archive_bytes)
        with _reading():
            reader.finish()
    missing = sorted(expected - written)
    if missing:
        raise ArchiveError(f"archive changed since it was inspected: member {_show(missing[0])} is gone")
    return total


def _make_parents(dest: Path, dir_parts: tuple[str, ...], made_dirs: set[tuple[str, ...]]) -> Path:
    current = dest
    for depth, part in enumerate(dir_parts, start=1):
        current = current / part
        if dir_parts[:depth] not in made_dirs:
            # mkdir fails on anything already there, so an unexpected link is never followed.
            os.mkdir(current, 0o755)
            os.chmod(current, 0o755)
            made_dirs.add(dir_parts[:depth])
    return current


def _write_member(reader: _Reader, entry: _Entry, target: Path, limits: ArchiveLimits, total_so_far: int,
                  archive_bytes: int) -> int:
    """Copy one member to ``target`` in chunks, checking what it really unpacks to; return the bytes written."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(target, flags, 0o644), "wb") as out:
        os.fchmod(out.fileno(), 0o644)
        return _copy_member(reader, entry, out, limits, total_so_far, archive_bytes)
