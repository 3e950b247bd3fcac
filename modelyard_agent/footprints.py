"""What an on-demand model's load adds to memory, as the loader (``modelyard_agent.residency``) measures it:
readings around a load (Triton's memory gauges, the resident memory of Triton's processes), the rise between
them, and ``<state dir>/footprints.json`` where the measured footprints are kept per model."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from modelyard_agent.runtimes.base import ServingRuntimeError, atomic_write
from modelyard_agent.runtimes.routes import read_json_file
from modelyard_agent.runtimes.triton import read_memory_in_use

logger = logging.getLogger(__name__)

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


class FootprintAccounts:
    """What an on-demand loader (``residency.OnDemandLoader``) counts its budget with: each model's footprint,
    the bytes the resident ones hold, the memory readings around a load and the budget's report.

    Needs, on the instance: ``gateway`` (its ``residency_file``), ``runtime`` (its ``inference_url``), ``budget``
    (bytes, or None), ``metrics_url`` (Triton's metrics, or empty), ``footprints_file`` and ``problem``.
    """

    def footprint(self, model: str) -> int | None:
        """The bytes ``model`` counts with: its deployment's measured footprint (``footprint_bytes`` of its
        registration), else the one measured at its first load here, else None (not measured yet)."""
        entry = read_json_file(self.gateway.residency_file).get("models", {}).get(model, {})
        return _declared_else_measured(entry, read_json_file(self.footprints_file).get(model))

    def _footprints(self) -> dict[str, int | None]:
        """``footprint`` of every registered model, from one read of each file."""
        measured = read_json_file(self.footprints_file)
        return {model: _declared_else_measured(entry, measured.get(model))
                for model, entry in read_json_file(self.gateway.residency_file).get("models", {}).items()}

    def _largest_footprint(self) -> int:
        return max([f for f in self._footprints().values() if f is not None] or [0])

    def _assumed_bytes(self, footprints: dict[str, int | None] | None = None) -> int:
        """What a model not measured yet counts as: the largest footprint known, or, with none known, the whole
        budget (one such model at a time: never past the budget, at the cost of evictions)."""
        known = [f for f in (self._footprints() if footprints is None else footprints).values() if f is not None]
        return max(known) if known else (self.budget or 0)

    def _resident_bytes(self, ready: set[str]) -> int:
        """Bytes the registered models in ``ready`` hold: a model whose footprint is not measured (its load added
        no memory that could be seen) counts as ``_assumed_bytes``, as its load assumed, never as 0 bytes, so the
        budget still holds."""
        footprints = self._footprints()
        assumed = self._assumed_bytes(footprints)
        return sum(assumed if footprints[m] is None else footprints[m] for m in ready if m in footprints)

    def enforcement_problem(self) -> str | None:
        """Why this host's budget cannot be held as measured, or None: with a budget, the agent must see Triton's
        memory gauges (``metrics_url``) or its processes' resident memory, else no load is measured and only the
        footprints deployments declare count (the others as ``_assumed_bytes``)."""
        if self.budget is None:
            return None
        gauges, resident = self._memory()
        if gauges is None and resident is None:
            return ("budget not enforceable as measured: the agent sees neither Triton's metrics "
                    "(--triton-metrics-url) nor its processes, so no load is measured; models count with the "
                    "footprints their deployments declare, the others as the largest of those (or the whole budget)")
        return None

    def _budget_report(self, ready: set[str]) -> dict | None:
        if self.budget is None:
            return None
        return {"budget_bytes": self.budget, "resident_bytes": self._resident_bytes(ready), "problem": self.problem}

    def _memory(self) -> tuple:
        """``(Triton's memory gauges or None, bytes resident in Triton's processes or None)`` now."""
        gauges = None
        if self.metrics_url:
            try:
                gauges = read_memory_in_use(self.metrics_url)
            except ServingRuntimeError as exc:
                logger.info("memory not measured: %s", exc.message)
        return gauges, triton_resident_bytes(self.runtime.inference_url)

    def _measure(self, model: str, before: tuple, after: tuple) -> int | None:
        """The memory ``model``'s load added, bytes (``_memory`` readings around it): GPU where Triton reports
        GPUs, else the resident memory of Triton's processes, else its CPU gauge; kept in ``footprints.json``.
        None when the readings are missing or did not rise (the CPU gauge is the machine's: another process
        may have freed memory meanwhile)."""
        rise = memory_rise(before, after)
        if rise is None:
            return None  # another process freed memory meanwhile: measured again at the next load
        keep_footprint(self.footprints_file, model, rise)
        return rise


def _declared_else_measured(registration: dict, measured) -> int | None:
    """A model's footprint, bytes: what its registration declares (``footprint_bytes``), else what a load
    measured here, else None."""
    known = registration.get("footprint_bytes")
    if known is None:
        known = measured
    return None if known is None else int(known)
