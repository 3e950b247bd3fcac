"""What an on-demand model's load adds to memory, as the loader (``modelyard_agent.residency``) measures it:
readings around a load (Triton's memory gauges, the resident memory of Triton's processes), the rise between
them, and ``<state dir>/footprints.json`` where the measured footprints are kept per model."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from modelyard_agent.runtimes.base import atomic_write
from modelyard_agent.runtimes.routes import read_json_file

# The footprints the loader measured, per model, in the agent's state directory.
FOOTPRINTS_FILE = "footprints.json"


def memory_rise(before: tuple, after: tuple) -> int | None:
    """Bytes a load added, from ``(Triton's memory gauges or None, bytes resident in Triton's processes or None)``
    read before and after it: GPU where Triton reports GPUs, else the resident memory of Triton's processes, else
    its CPU gauge (the machine's). None when the readings are missing or did not rise (another process may have
    freed memory meanwhile)."""
    (gauges_before, rss_before), (gauges_after, rss_after) = before, after

    def rise_of(a, b):
        return None if a is None or b is None else b - a

    rise = None
    if gauges_after is not None and gauges_after.gpus and gauges_before is not None:
        rise = rise_of(gauges_before.gpu_bytes, gauges_after.gpu_bytes)
    elif rss_before is not None and rss_after is not None:
        rise = rss_after - rss_before
    elif gauges_before is not None and gauges_after is not None:
        rise = rise_of(gauges_before.cpu_bytes, gauges_after.cpu_bytes)
    return None if rise is None or rise <= 0 else int(rise)


def keep_footprint(path: Path, model: str, footprint: int) -> None:
    """Keep ``model``'s measured ``footprint`` (bytes) in the footprints file ``path`` (made with its directory
    when missing)."""
    footprints = read_json_file(path)
    footprints[model] = int(footprint)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(footprints, indent=1, sort_keys=True))


def forget_footprint(state_dir: Path, model: str) -> None:
    """Drop the footprint measured for ``model`` in ``<state_dir>/footprints.json``: a deployment changed what it
    loads (another version, another config), so its next on-demand load measures it again."""
    path = Path(state_dir) / FOOTPRINTS_FILE
    footprints = read_json_file(path)
    if footprints.pop(model, None) is not None:
        atomic_write(path, json.dumps(footprints, indent=1, sort_keys=True))


def triton_resident_bytes(inference_url: str) -> int | None:
    """Bytes resident (RSS) in the process listening on ``inference_url``'s port on this machine and in its
    children (Triton and its python-backend stubs); None when no such process is visible from here (Triton
    on another machine or in a container of its own, or not allowed to look)."""
    port = urlsplit(inference_url if "://" in inference_url else f"http://{inference_url}").port
    try:
        for connection in psutil.net_connections(kind="tcp"):
            if connection.status == psutil.CONN_LISTEN and connection.pid and connection.laddr \
                    and connection.laddr.port == port:
                root = psutil.Process(connection.pid)
                return sum(process.memory_info().rss for process in [root, *root.children(recursive=True)])
    except (psutil.Error, OSError):
        return None
    return None
