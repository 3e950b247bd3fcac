"""What an on-demand model's load adds to memory, as the loader (``modelyard_agent.residency``) measures it:
readings around a load (Triton's memory gauges, the resident memory of Triton's processes), the rise between
them per device, and ``<state dir>/footprints.json`` where the measured footprints are kept per model version.

A footprint is ``{device: bytes}``, and the budget applies to each device on its own:

- On GPUs, the rise of ``nv_gpu_memory_used_bytes`` of each ``gpu_uuid`` whose used memory rose across the load
  (``runtimes.triton.read_memory_in_use``), read once Triton's metrics interval (``--triton-metrics-interval-ms``,
  Triton's ``--metrics-interval-ms``, 2,000 ms by default) has passed since the load, and since the last load or
  eviction before it: Triton refreshes the gauges only that often, and a reading sooner sees the old value.
- A load that raised no GPU's memory (a CPU model, on a GPU host too, or a host without GPUs) is measured in CPU
  memory, ``{"cpu": bytes}``: the rise of the resident memory of the Triton process that listens on
  ``--triton-url``'s port and of its children (the python backend's stubs), where the agent can see it, else of
  Triton's CPU gauge (which is the machine's). A load around which ``--triton-metrics-url`` could not be read is
  not measured: the resident memory of Triton's processes alone would take a GPU model for a CPU one.
- A footprint a deployment declares (``footprint_bytes``, one figure) and one an agent kept before footprints were
  per device (a bare number in ``footprints.json``) name no device: they count against every device, which may
  evict more than needed but never lets one device pass the budget unseen.
- A footprint is kept per model version: under ``<model>/<versions>`` (``footprint_key``: the versions the model's
  registration says it loads, ``1+2`` for a canary's two), so a new version never counts with the footprint of the
  one before it, and a rollback finds its version's measurement again. An entry an older agent kept
  per model (``<model>`` alone, measured for a version not known) still counts, on every device (as one figure),
  but the model is measured again at its next load, which replaces it.
- A model not measured yet counts, on every device, as the most one known footprint holds on one device (with
  none known, the whole budget) until its load measures it; a load that added nothing the agent could see leaves
  the model counted so and the budget's report says "budget not enforceable as measured: ...".
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from modelyard_agent.eviction import ANY_DEVICE, CPU_DEVICE, device_totals, overdrawn, peak
from modelyard_agent.runtimes.base import ServingRuntimeError, atomic_write
from modelyard_agent.runtimes.routes import read_json_file
from modelyard_agent.runtimes.triton import read_memory_in_use

logger = logging.getLogger(__name__)

# The footprints the loader measured, per model version, in the agent's state directory:
# {"<model>/<versions>": {device: bytes}} (``footprint_key``); an older agent's {model: {device: bytes} or bytes}.
FOOTPRINTS_FILE = "footprints.json"
# Triton's --metrics-interval-ms default: how often it refreshes its GPU and CPU memory gauges.
DEFAULT_METRICS_INTERVAL_MS = 2000
# Beyond the interval, for Triton's own poll of the devices and the scrape's round trip.
GAUGE_MARGIN_SECONDS = 0.1
# How long a measurement waits for the requests held for the load to be answered: a model's first inferences take
# memory of their own (the python backend's buffers and its shared-memory pages), which its footprint must count.
SERVED_WAIT_SECONDS = 1.0

# Memory a model holds, bytes per device: a GPU by Triton's gpu_uuid, "cpu", or ANY_DEVICE (not known: every one).
Footprint = dict[str, int]


def memory_rise(before: tuple, after: tuple) -> Footprint | None:
    """What a load added, ``{device: bytes}``, from ``(Triton's memory gauges or None, bytes resident in Triton's
    processes or None)`` read before and after it: per GPU (``gpu_uuid``), the rise of each one whose used memory
    rose; where no GPU's rose (a CPU model, on a GPU host too, or a host without GPUs), ``{"cpu": bytes}``: the rise
    of the resident memory of Triton's processes, else of its CPU gauge (the machine's). None when the readings are
    missing or nothing rose (another process may have freed memory meanwhile)."""
    (gauges_before, rss_before), (gauges_after, rss_after) = before, after
    if gauges_before is not None and gauges_after is not None:
        used = {gpu["gpu_uuid"]: gpu.get("memory_used") for gpu in gauges_before.gpus}
        rose = {gpu["gpu_uuid"]: gpu["memory_used"] - used[gpu["gpu_uuid"]] for gpu in gauges_after.gpus
                if gpu.get("memory_used") is not None and used.get(gpu["gpu_uuid"]) is not None
                and gpu["memory_used"] > used[gpu["gpu_uuid"]]}
        if rose:
            return rose
    rise = None
    if rss_before is not None and rss_after is not None:
        rise = rss_after - rss_before
    elif gauges_before is not None and gauges_after is not None and None not in (gauges_before.cpu_bytes,
                                                                                 gauges_after.cpu_bytes):
        rise = gauges_after.cpu_bytes - gauges_before.cpu_bytes
    return None if rise is None or rise <= 0 else {CPU_DEVICE: int(rise)}


def as_footprint(value) -> Footprint | None:
    """A footprint as a registration declares it or ``footprints.json`` keeps it, as ``{device: bytes}``: a bare
    number (a deployment's ``footprint_bytes``, measured wherever it was; or what an agent kept before footprints
    were per device) is bytes on a device not known, ``{ANY_DEVICE: bytes}``, counted against every device; None,
    or nothing positive, is None (not measured)."""
    sizes = value.items() if isinstance(value, dict) else [] if value is None else [(ANY_DEVICE, value)]
    try:
        footprint = {str(device): int(size) for device, size in sizes}
    except (TypeError, ValueError):
        return None
    return {device: size for device, size in footprint.items() if size > 0} or None


def describe(sizes: dict[str, int]) -> str:
    """``{device: bytes}`` for an operator: "1048576 bytes on GPU-5c3f…, 2048 bytes on cpu" ("1048576 bytes" on
    a device not known)."""
    return ", ".join(f"{size} bytes" + ("" if device == ANY_DEVICE else f" on {device}")
                     for device, size in sorted(sizes.items()))


def footprint_key(model: str, versions) -> str:
    """Where ``footprints.json`` keeps the footprint of ``model`` loading ``versions`` (the version numbers its
    registration names, any order): ``"<model>/<versions joined by +>"`` (``"iris/1+2"``), or ``"<model>/*"`` when
    the registration names none (one an older agent wrote). A model name never holds "/" (it is a directory of
    the model repository), so these keys never meet an older agent's per-model ones."""
    numbers = sorted({int(v) for v in versions or ()})
    return f"{model}/{'+'.join(map(str, numbers)) or '*'}"


def keep_footprint(path: Path, key: str, footprint: Footprint) -> None:
    """Keep the measured ``footprint`` (``{device: bytes}``) under ``key`` (``footprint_key``) in the footprints file
    ``path`` (made with its directory when missing), dropping what an older agent kept for the model as a whole,
    which this measurement replaces."""
    footprints = read_json_file(path)
    footprints.pop(key.split("/")[0], None)
    footprints[key] = {device: int(size) for device, size in footprint.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(footprints, indent=1, sort_keys=True))


def forget_footprint(state_dir: Path, model: str, versions=None) -> None:
    """Drop what was measured of ``model`` loading ``versions`` (and the per-model entry an older agent kept) in
    ``<state_dir>/footprints.json``: a deployment of those versions may load them with another config, so their
    next on-demand load measures them again. ``versions`` None: every footprint of the model."""
    path = Path(state_dir) / FOOTPRINTS_FILE
    footprints = read_json_file(path)
    gone = {model} | ({footprint_key(model, versions)} if versions is not None
                      else {key for key in footprints if key.startswith(f"{model}/")})
    if gone & set(footprints):
        for key in gone:
            footprints.pop(key, None)
        atomic_write(path, json.dumps(footprints, indent=1, sort_keys=True))


def version_footprints(state_dir: Path) -> dict[str, Footprint]:
    """The footprints the loader measured here, ``{"<model>/<versions>": {device: bytes}}`` (``footprint_key``;
    the per-model entries of an older agent left out, their version not being known), for the heartbeat: the
    control plane sends a version's measured footprint with its next on-demand deployment to any host."""
    measured = read_json_file(Path(state_dir) / FOOTPRINTS_FILE)
    return {key: footprint for key, value in sorted(measured.items())
            if "/" in key and not key.endswith("/*") and (footprint := as_footprint(value)) is not None}


# The process found listening on a port, by port: looked up again only once it has ended (a scan of every
# connection on the machine costs 50-100 ms on a busy host, and each measured load reads twice).
_listeners: dict[int, psutil.Process] = {}


def triton_resident_bytes(inference_url: str) -> int | None:
    """Bytes resident (RSS) in the process listening on ``inference_url``'s port on this machine and in its
    children (Triton and its python-backend stubs); None when no such process is visible from here (Triton
    on another machine or in a container of its own, or not allowed to look)."""
    port = urlsplit(inference_url if "://" in inference_url else f"http://{inference_url}").port
    try:
        root = _listener(port)
        if root is None:
            return None
        return sum(process.memory_info().rss for process in [root, *root.children(recursive=True)])
    except (psutil.Error, OSError):
        _listeners.pop(port, None)
        return None


def _listener(port: int | None) -> psutil.Process | None:
    """The process listening on TCP ``port`` here: the one found before while it runs (``is_running`` also tells a
    process that ended from a new one given its pid), else the one a scan of the machine's connections finds
    (None: none visible)."""
    known = _listeners.get(port)
    if known is not None and known.is_running():
        return known
    _listeners.pop(port, None)
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.pid and connection.laddr \
                and connection.laddr.port == port:
            _listeners[port] = psutil.Process(connection.pid)
            return _listeners[port]
    return None


class FootprintAccounts:
    """What an on-demand loader (``residency.OnDemandLoader``) counts its budget with: each model's footprint per
    device, the bytes the resident ones hold on each device, the memory readings around a load and the budget's
    report. The budget applies to each device (each GPU, CPU memory) on its own (``eviction.overdrawn``).

    Needs, on the instance: ``gateway`` (its ``residency_file``, ``residency()`` and ``inflight()``), ``runtime``
    (its ``inference_url``), ``budget`` (bytes per device, or None), ``metrics_url`` (Triton's metrics, or empty),
    ``metrics_interval`` (seconds between Triton's refreshes of its gauges), ``memory_changed_at`` (when a load or
    an eviction last ended, monotonic seconds), ``footprints_file``, ``problem`` and ``_reserved`` (the loads under
    way's reservations).
    """

    def footprint(self, model: str) -> Footprint | None:
        """The footprint ``model`` counts with, ``{device: bytes}``: its deployment's measured footprint
        (``footprint_bytes`` of its registration: one figure, counted on every device), else the one measured here
        for the versions its registration names, else one an older agent kept for the model as a whole (counted on
        every device: it may be of another version), else None (not measured yet)."""
        entry = read_json_file(self.gateway.residency_file).get("models", {}).get(model, {})
        return _declared_else_measured(model, entry, read_json_file(self.footprints_file))

    def measured(self, model: str) -> bool:
        """Whether ``model``'s footprint is known for what it loads now (declared by its deployment, or measured
        here for its registered versions); False sends its next load to be measured (alone)."""
        entry = read_json_file(self.gateway.residency_file).get("models", {}).get(model, {})
        return as_footprint(entry.get("footprint_bytes")) is not None or as_footprint(
            read_json_file(self.footprints_file).get(footprint_key(model, entry.get("versions")))) is not None

    def _footprints(self) -> dict[str, Footprint | None]:
        """``footprint`` of every registered model, from one read of each file."""
        measured = read_json_file(self.footprints_file)
        return {model: _declared_else_measured(model, entry, measured)
                for model, entry in read_json_file(self.gateway.residency_file).get("models", {}).items()}

    def _largest_footprint(self) -> Footprint:
        """On each device, the most one known footprint holds there: the room kept free between loads."""
        known = [f for f in self._footprints().values() if f is not None]
        devices = device_totals(known)
        largest: Footprint = {}
        for footprint in known:
            for device, size in device_totals([footprint], devices).items():
                largest[device] = max(largest.get(device, 0), size)
        return {device: size for device, size in largest.items() if size > 0}

    def _assumed(self, footprints: dict[str, Footprint | None] | None = None) -> Footprint:
        """What a model not measured yet counts as, on every device (where it lands is not known either): the
        most one known footprint holds on one device, or, with none known, the whole budget (one such model at a
        time: never past the budget, at the cost of evictions)."""
        known = [f for f in (self._footprints() if footprints is None else footprints).values() if f is not None]
        return {ANY_DEVICE: max([peak(f) for f in known] or [self.budget or 0])}

    def _held(self, resident: set[str], loading: str | None = None, *, reserved: bool = True,
              footprints: dict[str, Footprint | None] | None = None) -> dict[str, Footprint]:
        """What holds memory, by name: the registered models in ``resident`` (one whose footprint is not measured,
        its load having added no memory that could be seen, as ``_assumed``, as its load assumed, never as 0
        bytes, so the budget still holds) and, when ``reserved``, the loads under way (other than ``loading``'s)
        of models not resident yet (call with ``_room`` held). ``footprints``: ``_footprints()``, when read
        already."""
        footprints = self._footprints() if footprints is None else footprints
        assumed = self._assumed(footprints)
        held = {m: assumed if footprints[m] is None else footprints[m] for m in resident if m in footprints}
        if reserved:
            held.update((m, need) for m, need in self._reserved.items() if m not in resident and m != loading)
        return held

    def _overdrawn(self, resident: set[str], need: Footprint, loading: str | None = None) -> dict[str, int]:
        """The devices ``need`` names that would pass the budget beside what ``_held`` counts (``{}``: it fits)."""
        return overdrawn(self._held(resident, loading).values(), need, self.budget)

    def _resident_bytes(self, ready: set[str]) -> dict[str, int]:
        """Bytes the registered models in ``ready`` hold on each device, every device a known footprint names
        included (0 where nothing resident holds any)."""
        footprints = self._footprints()
        known = [f for f in footprints.values() if f is not None]
        held = self._held(ready, reserved=False, footprints=footprints)
        return device_totals(held.values(), device_totals(known) if known else ())

    def enforcement_problem(self) -> str | None:
        """Why this host's budget cannot be held as measured, or None: with a budget, the agent must see Triton's
        memory gauges (``metrics_url``) or its processes' resident memory, else no load is measured and only the
        footprints deployments declare count (the others as ``_assumed``)."""
        if self.budget is None:
            return None
        gauges, resident = self._memory()
        if gauges is None and resident is None:
            return ("budget not enforceable as measured: the agent sees neither Triton's metrics "
                    "(--triton-metrics-url) nor its processes, so no load is measured; models count with the "
                    "footprints their deployments declare, the others as the largest of those (or the whole budget)")
        return None

    def _budget_report(self, ready: set[str]) -> dict | None:
        """The budget as the gateway keeps it and the heartbeat brings it to the control plane: ``budget_bytes``
        (per device), ``resident_bytes`` (on the fullest device), ``devices`` (``{device: bytes held}``; a
        footprint of a device not known counts on each) and ``problem``; None without a budget."""
        if self.budget is None:
            return None
        held = self._resident_bytes(ready)
        return {"budget_bytes": self.budget, "resident_bytes": max(held.values()),
                "devices": {device: size for device, size in held.items() if device != ANY_DEVICE},
                "problem": self.problem}

    def _memory(self) -> tuple:
        """``(Triton's memory gauges or None, bytes resident in Triton's processes or None)`` now."""
        gauges = None
        if self.metrics_url:
            try:
                gauges = read_memory_in_use(self.metrics_url)
            except ServingRuntimeError as exc:
                logger.info("memory not measured: %s", exc.message)
        return gauges, triton_resident_bytes(self.runtime.inference_url)

    def _settled_memory(self) -> tuple:
        """``_memory`` once Triton's gauges show the last load or eviction (``memory_changed_at``), where a footprint
        is read from them (GPUs, or the CPU gauge when Triton's processes are out of sight): Triton refreshes them
        every ``metrics_interval`` seconds, so a reading sooner can be from before it (a load's rise read as 0, or
        an evicted model's memory read as still held). Sleeps for what is left of the interval and reads again;
        the resident memory of Triton's processes needs no wait."""
        reading = self._memory()
        gauges, resident = reading
        if gauges is None or (not gauges.gpus and resident is not None):
            return reading
        left = self.memory_changed_at + self.metrics_interval + GAUGE_MARGIN_SECONDS - time.monotonic()
        if left <= 0:
            return reading
        time.sleep(left)
        return self._memory()

    def _served(self, model: str, wait: float = SERVED_WAIT_SECONDS) -> None:
        """Wait up to ``wait`` seconds until no request for ``model`` is held or in flight at the gateway: the
        requests held for its load have been answered, so the reading after it counts what serving them took too
        (about 4 MiB more than the load of a python-backend model with 32 MiB of weights, bench/results/on_demand.md;
        measured at the load's end alone, the budget was passed by that much per model). Never raises."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                busy = self.gateway.residency()["models"].get(model, {}).get("held") or any(
                    count > 0 for key, count in self.gateway.inflight().items() if key.split("/")[0] == model)
            except ServingRuntimeError:
                return
            if not busy:
                return
            time.sleep(0.005)

    def _measure(self, model: str, before: tuple) -> Footprint | None:
        """The memory ``model``'s load added, ``{device: bytes}`` (``memory_rise`` between ``before`` and the
        ``_settled_memory`` after it), kept in ``footprints.json``. None when the readings are missing or did not
        rise, or when Triton's metrics (``metrics_url``) could not be read before or after it (the resident memory
        of Triton's processes alone would take a GPU model for a CPU one); with a budget, ``problem`` then says
        so, and the model counts as ``_assumed`` until a load measures it."""
        self._served(model)
        after = self._settled_memory()
        if self.metrics_url and (before[0] is None or after[0] is None):
            rise, why = None, f"Triton's metrics ({self.metrics_url}) could not be read around the load of {model}"
        else:
            rise, why = memory_rise(before, after), f"the load of {model} added no memory the agent could see"
        if rise is not None:
            # Kept for the versions the registration names: the model's lock, held around the load, keeps a
            # deployment from changing them meanwhile.
            entry = read_json_file(self.gateway.residency_file).get("models", {}).get(model, {})
            keep_footprint(self.footprints_file, footprint_key(model, entry.get("versions")), rise)
        elif self.budget is not None:
            self.problem = (f"budget not enforceable as measured: {why}, so it counts as "
                            f"{describe(self._assumed())} until a load measures it")
            logger.warning("on-demand memory budget: %s", self.problem)
        return rise


def _declared_else_measured(model: str, registration: dict, measured: dict) -> Footprint | None:
    """``model``'s footprint, ``{device: bytes}``: what its registration declares (``footprint_bytes``, one figure
    for every device), else what a load measured here for the versions it names (``measured``: the footprints
    file), else what an older agent kept for the model as a whole, as one figure for every device (the most it
    held on one device), else None."""
    declared = as_footprint(registration.get("footprint_bytes"))
    if declared is not None:
        return declared
    own = as_footprint(measured.get(footprint_key(model, registration.get("versions"))))
    if own is not None:
        return own
    older = as_footprint(measured.get(model))
    return None if older is None else {ANY_DEVICE: peak(older)}
