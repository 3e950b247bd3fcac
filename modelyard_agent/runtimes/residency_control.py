"""The gateway's side of models on demand, as the agent drives it: which models are registered on demand,
their state (resident, cold, evicting) and the loader's long poll (``modelyard_residency.lua``).

A model registered here need not be loaded in Triton: the gateway holds a request for it while it is not
resident and asks the agent's loader (``modelyard_agent.residency``) for it; models not registered are always
resident and the gateway passes their requests untouched. ``residency.json`` beside the routes keeps the
registrations for the next start of nginx, which then takes every model for cold until the loader reports.
"""

from __future__ import annotations

import json
from pathlib import Path

from modelyard_agent.runtimes.base import atomic_write
from modelyard_agent.runtimes.routes import read_json_file

RESIDENT, COLD, EVICTING = "resident", "cold", "evicting"


class ResidencyControl:
    """Mixed into ``TritonGateway`` (which provides ``dir``, ``_lock()`` and ``_control``)."""

    dir: Path

    @property
    def residency_file(self) -> Path:
        return self.dir / "residency.json"

    def residency(self) -> dict:
        """What the running gateway holds: ``{"models": {model: {"pinned", "state", "requests" (asked for since
        nginx started, whatever the outcome), "held" (requests held now),
        "last_used" (epoch seconds of the last request, or None), "wanted", "failure" ({message, retry_after}
        or None), "cold_start_timeout" (seconds), "max_held"}}, "budget": {"budget_bytes" (per device),
        "resident_bytes" (on the fullest device), "devices" ({device: bytes}), "problem"}}``.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("GET", path="/residency")

    def register_on_demand(self, model: str, *, pinned: bool = False, cold_start_timeout: float = 30.0,
                           max_held: int = 256, state: str | None = None,
                           footprint_bytes: int | None = None, versions: list[int] | None = None) -> dict:
        """Register ``model`` on demand (or change its settings): its requests are held while it is not
        resident, up to ``cold_start_timeout`` seconds and ``max_held`` requests at once; ``state`` sets its
        state too (None: leave it, a new model counts as cold). ``footprint_bytes`` is the model's measured memory
        when its deployment knows it (the loader measures it otherwise); ``versions``, the version numbers its
        ``config.pbtxt`` loads, are what the loader keeps a measured footprint under (``footprints.footprint_key``).
        Kept in ``residency.json``. Only this model goes to the gateway (``PATCH /residency``), whatever else is
        registered. Idempotent.

        Returns:
            ``residency()`` of this model alone: ``{"models": {model: {...}}, "budget": {...}}``.

        Raises:
            ValueError: a timeout that is not positive, ``max_held`` below 1 or an unknown state.
            ServingRuntimeError: the gateway refused or did not answer.
        """
        if float(cold_start_timeout) <= 0 or int(max_held) < 1:
            raise ValueError("cold_start_timeout must be positive seconds and max_held at least 1")
        if state not in (None, RESIDENT, COLD, EVICTING):
            raise ValueError(f"state must be resident, cold or evicting; got {state!r}")
        entry = {"pinned": bool(pinned), "cold_start_timeout": float(cold_start_timeout), "max_held": int(max_held),
                 **({"footprint_bytes": int(footprint_bytes)} if footprint_bytes is not None else {}),
                 **({"versions": sorted({int(v) for v in versions})} if versions else {})}
        return self._change_registrations(model, entry, state)

    def unregister_on_demand(self, model: str) -> dict:
        """Make ``model`` always resident again at the gateway (its requests pass untouched). Idempotent.

        Returns:
            ``{"models": {}, "budget": {...}}``.

        Raises:
            ServingRuntimeError: as ``register_on_demand``.
        """
        return self._change_registrations(model, None, None)

    def resync_residency(self) -> dict:
        """Send the gateway every registration ``residency.json`` holds at once (``POST /residency``), replacing
        what it holds: a model it holds that the file does not is always resident again. A gateway that starts
        reads the file itself; this is for one whose registrations are in doubt. States are left as they are.
        Idempotent.

        Returns:
            ``residency()`` after the change.

        Raises:
            ServingRuntimeError: the gateway refused the registrations or does not answer.
        """
        with self._lock():
            return self._control("POST", {"models": read_json_file(self.residency_file).get("models", {})},
                                 path="/residency")

    def _change_registrations(self, model: str, entry: dict | None, state: str | None) -> dict:
        """Keep ``model``'s ``entry`` (None: remove it) in ``residency.json`` and send the gateway that one change."""
        with self._lock():
            held = read_json_file(self.residency_file)
            models = held.get("models", {})
            if entry is None:
                models.pop(model, None)
            else:
                models[model] = entry
            atomic_write(self.residency_file, json.dumps({"models": models}, indent=1, sort_keys=True))
            change = None if entry is None else {**entry, **({"state": state} if state else {})}
            return self._control("PATCH", {"models": {model: change}}, path="/residency")

    def report_residency(self, model: str, state: str | None = None, *, reason: str | None = None,
                         failure: tuple[str, float] | None = None, budget: dict | None = None,
                         abandoned: bool = False, load_seconds: float | None = None) -> dict:
        """The loader's report of ``model``: its ``state`` (None: unchanged), the ``reason`` of an eviction (with
        state cold; counted in ``modelyard_evictions_total``), a failed load as ``(message, retry_after
        seconds)`` (held requests are answered 503 with it, and so is every request until it expires) and the
        host's ``budget`` (``{"budget_bytes", "resident_bytes", "devices", "problem"}``, exposed as gauges, the
        bytes held per device as ``modelyard_device_resident_bytes``); ``abandoned``: the loader
        will not load it, since no request waits for it any more (its want ends, so a later request wants it anew);
        ``load_seconds``: how long the load took in Triton, the one that made it resident or, with ``failure``, the one
        that failed (``modelyard_model_load_seconds``, ``outcome`` "loaded" or "failed").

        Returns:
            ``residency()`` of this model alone (``{"models": {}, ...}`` for a model not registered).

        Raises:
            ServingRuntimeError: the gateway refused or did not answer.
        """
        body: dict = {"model": model}
        if state is not None:
            body["state"] = state
        if reason is not None:
            body["reason"] = reason
        if failure is not None:
            body["failure"] = {"message": failure[0], "retry_after": float(failure[1])}
        if budget is not None:
            body["budget"] = budget
        if abandoned:
            body["abandoned"] = True
        if load_seconds is not None:
            body["load_seconds"] = float(load_seconds)
        return self._control("PUT", body, path="/residency/state")

    def forget_taken(self) -> dict:
        """Hand out again every want an earlier loader took and never answered (a loader that starts calls it:
        the one before it may have died between taking a model and loading it). Returns ``residency()``.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("DELETE", path="/residency/taken")

    def wanted(self, wait: float = 10.0) -> list[str]:
        """The loader's long poll: the models held requests wait for that no earlier poll took, as soon as there
        is one, or ``[]`` after ``wait`` seconds (at most 30). Each model is handed out once; a loader that stops
        polling for ``LOADER_STALE`` (3) seconds is taken for dead and held requests are answered 503.

        Raises:
            ServingRuntimeError: the control socket does not answer (retryable).
        """
        return self._control("GET", path=f"/residency/wanted?wait={float(wait):g}", timeout=float(wait) + 5.0)
