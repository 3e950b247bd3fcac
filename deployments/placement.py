"""Placement: which hosts a label selector puts a model version on, by free GPU memory.

The footprint of a version is what its last load measured on a host (GPU memory delta, bytes;
see ``modelyard_agent.triton_host``); free memory per host comes from Prometheus (``nv_gpu_memory_*``
gauges Triton exports), falling back to the host agent's last heartbeat when Prometheus cannot
answer. ``plan`` is a pure function so that planning a whole fleet costs no I/O per host.
"""

import logging
from dataclasses import dataclass

from deployments.models import DeploymentTarget, ServingHost
from deployments.profiles import card_gpu_bytes
from modelyard.errors import InvalidInput, ServiceUnavailable
from monitoring.readings import host_memory
from registry.models import ModelVersion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostCapacity:
    """A candidate host: its name and free GPU memory in bytes (None: no GPU figures known)."""

    name: str
    free_gpu_bytes: int | None


def plan(candidates: list[HostCapacity], *, footprint_bytes: int | None, replicas: int) -> list[str]:
    """Pick ``replicas`` hosts with the most free GPU memory that can hold ``footprint_bytes``.

    Args:
        candidates: hosts that match the selector and are online.
        footprint_bytes: the version's measured GPU footprint; None or 0 when unknown (any
            host fits, a host without GPU figures too).
        replicas: how many hosts to choose (1 or more).

    Returns:
        Host names, most free memory first (ties by name), ``len == replicas``.

    Raises:
        InvalidInput: fewer than ``replicas`` hosts fit; the message says how many did and why.

    Cost: O(n log n) in the number of candidates.
    """
    need = footprint_bytes or 0
    fitting = [c for c in candidates if need == 0 or (c.free_gpu_bytes is not None and c.free_gpu_bytes >= need)]
    fitting.sort(key=lambda c: (-(c.free_gpu_bytes or 0), c.name))
    if len(fitting) < replicas:
        raise InvalidInput(
            f"only {len(fitting)} of {len(candidates)} matching online host(s) have "
            f"{need} bytes of GPU memory free; {replicas} needed"
        )
    return [c.name for c in fitting[:replicas]]


def measured_footprint(version: ModelVersion) -> int | None:
    """The GPU bytes the newest successful load of ``version`` took on any host; before any load, what
    its performance card measured (``deployments.profiles.card_gpu_bytes``); else None."""
    for details in (
        DeploymentTarget.objects.filter(deployment__version=version, state="ready")
        .order_by("-updated_at").values_list("details", flat=True)[:20]
    ):
        gpu = ((details or {}).get("footprint_bytes") or {}).get("gpu")
        if isinstance(gpu, int | float) and gpu > 0:
            return int(gpu)
    return card_gpu_bytes(version)


def free_gpu_memory(hosts: list[ServingHost]) -> dict[str, int | None]:
    """Free GPU memory per host in bytes, from Prometheus, else from each host's last heartbeat."""

    names = [h.name for h in hosts]
    try:
        rows = host_memory(names)
        return {r["host"]: (None if r["gpu_total"] is None else int(r["gpu_total"] - r["gpu_used"])) for r in rows}
    except ServiceUnavailable as exc:
        logger.warning("placement falls back to heartbeats: %s", exc)
    free = {}
    for host in hosts:
        gpus = host.heartbeat.get("gpus") or []
        free[host.name] = (
            int(sum((g.get("memory_total") or 0) - (g.get("memory_used") or 0) for g in gpus)) if gpus else None
        )
    return free


def choose_hosts(version: ModelVersion, selector: dict[str, str], *, replicas: int | None = None) -> list[ServingHost]:
    """The hosts a selector deploys ``version`` to.

    Args:
        version: the model version to place.
        selector: labels a host must all carry with these values.
        replicas: None for every matching host; else how many online matching hosts to pick
            by free GPU memory against the version's measured footprint.

    Returns:
        The hosts, in placement order.

    Raises:
        InvalidInput: no host matches, replicas below 1, or too few hosts fit.
    """
    matching = [h for h in ServingHost.objects.order_by("name")
                if all(h.labels.get(k) == v for k, v in selector.items())]
    if not matching:
        raise InvalidInput(f"no serving host carries the labels {selector}")
    if replicas is None:
        return matching
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InvalidInput(f"replicas must be 1 or more, got {replicas!r}")
    online = [h for h in matching if h.is_online()]
    free = free_gpu_memory(online)
    chosen = plan([HostCapacity(h.name, free.get(h.name)) for h in online],
                  footprint_bytes=measured_footprint(version), replicas=replicas)
    by_name = {h.name: h for h in online}
    return [by_name[n] for n in chosen]


@dataclass(frozen=True)
class Placement:
    """Where one model version goes in a fleet plan: its hosts and the batch each host moves in."""

    model: str
    hosts: tuple[str, ...]
    batches: tuple[int, ...]


def plan_fleet(
    demands: list[tuple[str, int | None, int]], candidates: list[HostCapacity], *, batch_size: int = 1,
) -> list[Placement]:
    """Place many model versions at once, charging each placement against the host's free memory.

    Args:
        demands: ``(model name, footprint bytes or None, replicas)`` per model version, placed
            in the given order (put the largest first for a tighter packing).
        candidates: the hosts and their free GPU memory in bytes.
        batch_size: hosts moved at once within each model's rollout.

    Returns:
        One Placement per demand, in order; hosts most-free first at the time of placement.

    Raises:
        InvalidInput: a model version fits on fewer hosts than its replicas.

    Cost: O(D · (H + R log H)) for D demands, H hosts and R replicas: a linear scan for the
    hosts that fit, then a partial sort of those.
    """
    import heapq

    free = {c.name: c.free_gpu_bytes for c in candidates}
    placements = []
    for model, footprint, replicas in demands:
        need = footprint or 0
        fitting = [(-(f or 0), name) for name, f in free.items() if need == 0 or (f is not None and f >= need)]
        if len(fitting) < replicas:
            raise InvalidInput(f"{model}: only {len(fitting)} host(s) have {need} bytes of GPU memory free; "
                               f"{replicas} needed")
        chosen = [name for _, name in heapq.nsmallest(replicas, fitting)]
        for name in chosen:
            if free[name] is not None:
                free[name] -= need
        placements.append(Placement(model, tuple(chosen), tuple(i // batch_size for i in range(len(chosen)))))
    return placements
