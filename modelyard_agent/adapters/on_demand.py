"""Deployments of models registered on demand on a Triton host (``residency: "on_demand"`` in the payload):
a new version of a model that is not resident is staged, not loaded, and the gateway holds the model's
requests until the agent's loader (``modelyard_agent.residency``) loads it; the loader itself is started
beside the agent's worker (``adapters.triton.start_loader``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from redis.lock import Lock

from modelyard_agent.config import current as settings
from modelyard_agent.contract import REGISTERED
from modelyard_agent.coordination import host_model_lock
from modelyard_agent.footprints import forget_footprint
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.residency_control import COLD, RESIDENT
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_host import stage_on_demand
from modelyard_agent.triton_staging import AgentPaths

logger = logging.getLogger(__name__)

ON_DEMAND, ALWAYS = "on_demand", "always"
DEFAULT_COLD_START_TIMEOUT = 30.0
# Seconds the loader waits for a model's lock that a deployment holds before it answers the held requests 503.
LOCK_WAIT_SECONDS = 2.0


def register_residency(gateway, payload: dict, *, resident: bool, versions: list[int]) -> str:
    """Register ``payload["model"]`` on demand at ``gateway`` (pinned, cold-start timeout and footprint from the
    payload; state resident or cold; ``versions``: the version numbers its ``config.pbtxt`` now loads, which its
    measured footprint is kept for), or, for a payload that is not on demand, make a model registered before
    always resident again. Returns the residency now: "on_demand" or "always".

    Raises:
        ServingRuntimeError: the gateway refused or did not answer.
    """
    model = payload["model"]
    if payload.get("residency") != ON_DEMAND:
        if model in gateway.residency()["models"]:
            gateway.unregister_on_demand(model)
        return ALWAYS
    gateway.register_on_demand(model, pinned=bool(payload.get("pinned")),
                               cold_start_timeout=float(payload.get("cold_start_timeout")
                                                        or DEFAULT_COLD_START_TIMEOUT),
                               footprint_bytes=payload.get("footprint_bytes"), state=RESIDENT if resident else COLD,
                               versions=versions)
    # The same versions deployed again may load with another config: measured again at their next load.
    forget_footprint(AgentPaths(Path(settings().model_repository), settings().staging_dir).state_dir, model,
                     versions)
    return ON_DEMAND


def registered_not_resident(registered: dict, routes: dict, models: list[dict]) -> list[dict]:
    """Heartbeat rows for the on-demand models Triton does not hold now: ``{"name", "version", "state":
    "REGISTERED"}`` for each version their route gives (stable, canary, shadow), so the control plane reads them
    as registered rather than lost; ``registered`` as ``residency()["models"]``, ``routes`` the gateway's,
    ``models`` the heartbeat's rows from Triton's index."""
    ready = {row["name"] for row in models if row.get("state") == "READY"}
    rows = []
    for model in sorted(set(registered) - ready):
        route = routes.get(model) or {}
        versions = {route.get(role) for role in ("stable", "canary", "shadow")} - {None}
        rows += [{"name": model, "version": int(v), "state": REGISTERED} for v in sorted(versions)]
    return rows


def deploy_cold(gateway, payload: dict, *, route: dict | None, limit) -> dict | None:
    """Deploy ``payload``'s version of an on-demand model that Triton does not hold now: stage it, route the
    model to it (with a canary or shadow of ``route``'s stable version, when the payload asks for one) and
    register the model cold. Returns the deployment's result, or None when the model is resident (the caller
    swaps it as any other).

    Args:
        gateway: the host's ``TritonGateway``, running.
        route: the route the gateway held before (for a canary's stable version), or None.
        limit: the request body limit of the version (``formats.request_limits.RequestLimit``).
    """
    model, version = payload["model"], int(payload["version"])
    try:
        if TritonRuntime(settings().triton_url, timeout=10.0).ready_versions(model):
            return None
    except ServingRuntimeError as exc:
        return {"state": "failed", "retryable": exc.retryable, "details": {},
                "error": f"Triton is not reachable: {exc.message}"}
    percent, shadow_percent = payload.get("canary_percent"), payload.get("shadow_percent")
    stable = route["stable"] if route and route.get("stable") not in (None, version) else None
    result = stage_on_demand({**payload, "inference_url": settings().triton_url},
                             model_repository=Path(settings().model_repository),
                             versions=[version] + ([stable] if stable is not None else []),
                             load_timeout=float(payload.get("load_deadline") or settings().load_deadline),
                             staging_dir=settings().staging_dir)
    if result["state"] != "ready":
        return result
    try:
        if stable is not None:
            held = gateway.set_route(model, stable=stable, canary=version, percent=float(percent or 0),
                                     shadow=version if shadow_percent else None,
                                     shadow_percent=float(shadow_percent or 0))
        else:
            held = gateway.set_route(model, stable=version)
        result["details"].update(route=held, request_limit={"bytes": limit.bytes, "basis": limit.basis},
                                 residency=register_residency(gateway, payload, resident=False,
                                                              versions=[version] + ([stable] if stable is not None
                                                                                    else [])))
    except ServingRuntimeError as exc:
        return {"state": "failed", "retryable": exc.retryable, "details": result["details"],
                "error": f"the host's gateway: {exc.message}"}
    return result


def model_locks(lock_of: Callable[[str], Lock]) -> Callable[[str], AbstractContextManager]:
    """``(model, wait=None) -> context manager`` holding ``lock_of(model)`` (a Redis lock) around one on-demand load
    or eviction: a deployment that holds it for more than ``wait`` seconds (None: ``LOCK_WAIT_SECONDS``; 0: not
    at all, as evictions ask) makes it raise ``TimeoutError`` (a load is then answered 503, retry soon; an
    eviction passes the model over). When Redis does not answer, the
    ``redis`` error is raised as it is (the loader fails that one load and goes on)."""

    @contextmanager
    def model_lock(model: str, wait: float | None = None):
        lock = lock_of(model)
        if not lock.acquire(blocking=wait != 0, blocking_timeout=LOCK_WAIT_SECONDS if wait is None else wait):
            raise TimeoutError(f"a deployment of {model} on this host is in progress; try again when it ends")
        try:
            yield
        finally:
            try:
                lock.release()
            except Exception:  # noqa: BLE001 - an expired lock is released already; Redis may be down
                logger.warning("the lock of %s could not be released (expired, or Redis does not answer)", model)

    return model_lock


# The agent's per-(host, model) lock (``coordination.host_model_lock``), the one its deployments take.
model_lock = model_locks(lambda model: host_model_lock(settings().host, model))
