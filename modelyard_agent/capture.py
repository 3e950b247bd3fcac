"""Request capture on a Triton host: what the agent does with the files its gateway writes.

The gateway (``runtimes.gateway.TritonGateway``: drawn in nginx's rewrite phase, written in its log phase)
appends a sampled share of each model's client infer requests to ``capture_directory(model)`` as ndjson
lines (the capture contract:
``{"id", "time", "model", "version", "content_type", "header_length", "body"}``, ``body`` the request bytes
in base64). On every heartbeat the agent (``enforce``):

- deletes the files whose newest request is older than the model's retention (a file holds one UTC hour
  of one worker, so a request is deleted at most an hour after its retention ended);
- deletes the whole capture of a model whose capture is off, or that the host has not served for
  ``UNSERVED_GRACE_SECONDS``;
- tells the gateway the bytes left on disk, so its bound (``max_bytes``) counts from what is there;
- reports per model ``{"requests", "bytes", "oldest", "newest", "skipped"}`` for the heartbeat's gateway
  block (``contract.GatewayReport``).

Captured bodies never leave the host here: the report carries counts and times only.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from modelyard_agent.runtimes.gateway import CAPTURE_SUFFIX

# Seconds a captured model may be not READY on the host before its capture is deleted.
UNSERVED_GRACE_SECONDS = 600

# Newline counts of capture files already read, per path: (size in bytes, lines), so a heartbeat reads only
# what was appended since the last one.
_LINES: dict[Path, tuple[int, int]] = {}


def capture_files(directory: Path) -> list[Path]:
    """The capture files of one model's directory, oldest hour first (``[]`` when there is none); symlinks are
    left out (nginx's workers write plain files; a link could point the root agent at any file)."""
    try:
        return sorted(path for path in Path(directory).iterdir()
                      if path.name.endswith(CAPTURE_SUFFIX) and not path.is_symlink())
    except FileNotFoundError:
        return []


def _count_lines(path: Path, size: int) -> int:
    known_size, known = _LINES.get(path, (0, 0))
    if size < known_size:
        known_size, known = 0, 0
    with open(path, "rb") as data:
        data.seek(known_size)
        while chunk := data.read(1 << 20):
            known += chunk.count(b"\n")
    _LINES[path] = (size, known)
    return known


def _first_time(path: Path) -> float | None:
    with open(path, "rb") as data:
        try:
            return float(json.loads(data.readline())["time"])
        except (ValueError, KeyError, TypeError):
            return None


def enforce(gateway, served: set[str] | None, *, now: float | None = None) -> dict[str, dict]:
    """Apply retention and the capture's scope on ``gateway``'s host, then report each captured model.

    Args:
        gateway: the host's ``TritonGateway``, running.
        served: the names of the models the host serves now (READY on Triton); None when unknown (Triton
            does not answer): then no capture is deleted for that reason. A model's capture is deleted
            once it has not been served for ``UNSERVED_GRACE_SECONDS``.
        now: unix seconds (default: the clock).

    Returns:
        ``{model: {"fraction", "max_bytes", "retention_seconds" (the settings the gateway holds),
        "requests": lines on disk, "bytes": bytes on disk, "oldest": unix seconds of the oldest
        request or None, "newest": unix seconds of the last write or None, "skipped": requests drawn but not
        captured since the gateway started}}`` for each model whose capture is on.

    Raises:
        ServingRuntimeError: the gateway's control socket does not answer.
    """
    now = time.time() if now is None else now
    held = gateway.capture()
    root = gateway.dir / "capture"
    if root.is_dir():
        for directory in root.iterdir():
            if directory.name.startswith("."):
                continue
            if directory.is_symlink():  # never followed: a capture directory is a directory
                directory.unlink()
                continue
            if not directory.is_dir():
                continue
            marker = root / f".unserved-{directory.name}"
            if directory.name not in held:
                shutil.rmtree(directory, ignore_errors=True)
                marker.unlink(missing_ok=True)
            elif served is not None and directory.name not in served:
                # Not READY now: a failed load or a Triton still loading after a restart must not cost the
                # capture; a model gone for UNSERVED_GRACE_SECONDS has left the host.
                since = float(marker.read_text()) if marker.exists() else None
                if since is None:
                    marker.write_text(repr(now))
                elif now - since >= UNSERVED_GRACE_SECONDS:
                    shutil.rmtree(directory, ignore_errors=True)
                    marker.unlink(missing_ok=True)
            else:
                marker.unlink(missing_ok=True)
    usage, report = {}, {}
    for model, settings in held.items():
        directory = gateway.capture_directory(model)
        if not directory.is_dir():
            gateway._prepare_capture_directory(model)  # deleted above or by hand: the workers need it back
        cutoff = now - float(settings["retention_seconds"])
        files = []
        for path in capture_files(directory):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            if stat.st_mtime < cutoff:
                path.unlink(missing_ok=True)
                _LINES.pop(path, None)
            else:
                files.append((path, stat))
        size = sum(stat.st_size for _, stat in files)
        usage[model] = size
        report[model] = {
            "fraction": settings["fraction"], "max_bytes": settings["max_bytes"],
            "retention_seconds": settings["retention_seconds"],
            "requests": sum(_count_lines(path, stat.st_size) for path, stat in files), "bytes": size,
            "oldest": _first_time(files[0][0]) if files else None,
            "newest": max(stat.st_mtime for _, stat in files) if files else None,
            "skipped": int(settings.get("skipped") or 0),
        }
    for path in [path for path in _LINES if not path.exists()]:
        _LINES.pop(path, None)
    if usage:
        gateway.set_capture_usage(usage)
    return report
