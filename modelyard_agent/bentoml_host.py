"""The deployment steps of a BentoML host agent: the blue/green swap of a model's version, its canary split
and the split's end, a route change and an unload, as the adapter (``adapters.bentoml``) calls them.

Runs on the serving host; like the Triton agent (``modelyard_agent.triton_host``) it needs no database or
S3 credentials, only the payload built by ``build_agent_payload``.

A swap of model M from the version that serves (blue) to a new one (green):

1. download the archive (size and sha256 checked) and import it into the host's store
   (``bentoml_import``, under the host-wide lock);
2. record green as M's ``starting`` instance in the state file, then start ``bentoml serve`` for its
   exact tag on a free port with its own BENTOML_HOME, and wait for /readyz;
3. send the version's sample input to it, when the version has one;
4. point nginx's upstream for ``/M/`` at green with a graceful reload; record green as serving;
5. wait until nginx's old workers finished their requests (blue is drained), stop blue's whole
   process group and check its port is free.

A failure up to step 4 stops green and leaves blue serving untouched. The state file
(``<root>/serving.json``, ``bentoml_instances.ServeState``) lets a restarted agent finish or undo a
swap its predecessor died in (``bentoml_instances.recover_model``), which each deployment runs first.
A Bento model (``.bentomodel``) is imported into the store only: it has no service to serve.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from modelyard_agent.bentoml_import import import_into_store
from modelyard_agent.bentoml_instances import ServeState, discard_instance, front_for, recover_model
from modelyard_agent.contract import BENTO, BENTO_MODEL, TargetState
from modelyard_agent.runtimes import bentoml as serve
from modelyard_agent.runtimes.base import ServingRuntimeError, StagingError
from modelyard_agent.runtimes.bento_store import BentoStore
from modelyard_agent.runtimes.nginx import NginxFront
from modelyard_agent.steps import DeploySteps

logger = logging.getLogger(__name__)


def deploy_bentoml_version(
    payload: dict,
    *,
    root: Path,
    report: Callable[[str], None] = lambda state: None,
    load_timeout: float = 600.0,
    unload_timeout: float = 120.0,
) -> dict:
    """Import one version into this host's Bento Store and, for a Bento, make it the one served.

    Args:
        payload: built by ``build_agent_payload`` (model, version, format, artifact_url, sha256,
            size in bytes, signature with ``bentoml.tag`` and ``bentoml.apis``, sample_input,
            inference_url: nginx's address).
        root: the agent's BentoML directory (store, instances, nginx, state file).
        report: called with "staging", "loading", "verifying" and "cutting_over" as work proceeds.
        load_timeout: seconds allowed for the import, and for the new service to become ready.
        unload_timeout: seconds allowed for the old version's requests to finish, and for it to stop.

    Returns:
        ``{"state": "ready", "details": {...}}`` or ``{"state": "failed", "error": "...",
        "retryable": bool, "details": {...}}``; details hold ``previous_versions``, the ``tag``,
        the new instance's ``port``, step durations in seconds, and ``drain_error`` when the new
        version serves but the old one did not stop in time (left for ``recover_model``).
    """
    root = Path(root)
    model, version = payload["model"], int(payload["version"])
    tag = ((payload.get("signature") or {}).get("bentoml") or {}).get("tag", "")
    kind = BENTO if payload.get("format") == BENTO else BENTO_MODEL
    steps = DeploySteps(model, version, report, {"tag": tag})
    details, failed = steps.details, steps.failed

    steps.begin(TargetState.STAGING)
    try:
        details["staged"] = import_into_store(payload, BentoStore(root), kind=kind, tag=tag, timeout=load_timeout)
    except StagingError as exc:
        return failed(exc.message, retryable=exc.retryable)
    steps.done("stage_seconds")
    if kind == BENTO_MODEL:
        details["served"] = False
        return steps.ready()

    front = front_for(root, payload["inference_url"])
    try:
        front.ensure_running()
        if payload.get("inference_keys") is not None and not front.splits:
            return failed("the model requires an inference key, which nginx checks with its Lua module only: "
                          "install Debian's libnginx-mod-http-lua and lua-cjson on this host", retryable=False)
        if "inference_keys" in payload and front.splits:  # before the version serves: a keyed model is never open
            front.set_inference_keys({model: payload["inference_keys"]})
        blue = recover_model(root, front, model)
    except ServingRuntimeError as exc:
        return failed(f"nginx: {exc.message}", retryable=exc.retryable)
    canary = ServeState(root).read().get(model, {}).get("canary")
    split = payload.get("canary_percent") is not None or payload.get("shadow_percent") is not None
    if split and blue is not None and blue.version != version:
        return _deploy_canary(payload, root, front, steps, blue=blue, old_canary=canary,
                              load_timeout=load_timeout, unload_timeout=unload_timeout)
    if canary is not None and blue is not None and version in (blue.version, canary.version):
        return _end_split(root, front, model, steps, keep=blue if version == blue.version else canary,
                          other=canary if version == blue.version else blue, unload_timeout=unload_timeout)
    details["previous_versions"] = [i.version for i in (blue, canary) if i is not None and i.version != version]
    if blue is not None and blue.tag == tag and blue.version == version:
        details["port"] = blue.port
        return steps.ready()
    was_split = front.is_split(model)

    steps.begin(TargetState.LOADING)
    state = ServeState(root)
    green = serve.plan_instance(root, BentoStore(root).home, model=model, version=version, tag=tag)
    state.update(model, starting=green)  # before the start: a crash right after still finds its home
    try:
        green = serve.start_ready(green, load_timeout, lambda started: state.update(model, starting=started))
        steps.done("load_seconds")
        if payload.get("sample_input"):
            steps.begin(TargetState.VERIFYING)
            serve.smoke_request(green, payload["sample_input"], payload.get("signature") or {})
            steps.done("smoke_seconds")
        steps.begin(TargetState.CUTTING_OVER)
        old_workers = front.switch(model, green.port, version)
    except ServingRuntimeError as exc:
        green = exc.instance if isinstance(exc, serve.StartFailed) else green
        if blue is not None and front.upstream_port(model) == green.port:
            try:  # the switch went half way (e.g. the reload was slow): route back before green stops
                back_to = front.split(model) if was_split else front.switch(model, blue.port, blue.version)
                front.wait_drained(back_to, timeout=unload_timeout)
            except ServingRuntimeError as back:
                logger.error("could not route %s back to version %s: %s", model, blue.version, back.message)
        discard_instance(state, model, green)
        return failed(f"{model} version {version} ({tag}) did not take over: {exc.message}",
                      retryable=exc.retryable)
    state.update(model, serving=green, starting=None, draining=blue)
    details["port"] = green.port
    try:
        front.wait_drained(old_workers, timeout=unload_timeout)
        for old in (blue, canary):  # a split model's canary goes too: a plain rollout ends its canary
            if old is not None:
                serve.stop_instance(old, timeout=unload_timeout)
                shutil.rmtree(old.home, ignore_errors=True)
        state.update(model, canary=None)
        if was_split:
            front.remove_route(model)
    except ServingRuntimeError as exc:
        # The new version serves (the target is READY); the old one stays recorded as draining, and
        # the next heartbeat or deployment of the model stops it (recover_model).
        logger.error("%s v%s serves, but the old instance did not stop: %s", model, version, exc.message)
        details["drain_error"] = exc.message
        return steps.ready()
    state.update(model, draining=None)
    steps.done("cutover_seconds")
    return steps.ready()


def _deploy_canary(payload: dict, root: Path, front: NginxFront, steps: DeploySteps, *, blue: serve.Instance,
                   old_canary: serve.Instance | None, load_timeout: float, unload_timeout: float) -> dict:
    """Start ``payload``'s version beside ``blue`` (the stable version, which keeps serving) and split the
    model: ``canary_percent`` of its requests that name no version to the new one, ``shadow_percent`` of them
    mirrored to it. An earlier canary of another version is replaced: it stops once no request is on its
    way to it. The split needs no reload, except the first time the model's location is split.

    Returns:
        As ``deploy_bentoml_version``; details also hold ``kept_versions`` ([the stable version]) and the
        ``route`` nginx now holds.
    """
    model, version = payload["model"], int(payload["version"])
    tag = ((payload.get("signature") or {}).get("bentoml") or {}).get("tag", "")
    details, failed = steps.details, steps.failed
    if not front.splits:
        return failed("a canary on a BentoML host needs nginx's Lua module: install Debian's libnginx-mod-http-lua "
                      "and lua-cjson on this host and restart its agent", retryable=False)
    percent, shadow_percent = float(payload.get("canary_percent") or 0), float(payload.get("shadow_percent") or 0)
    details["kept_versions"] = [blue.version]

    def route_to(canary: serve.Instance) -> dict:
        return {"stable": blue.version, "canary": canary.version, "percent": percent,
                "shadow": canary.version if shadow_percent else None, "shadow_percent": shadow_percent,
                "ports": {blue.version: blue.port, canary.version: canary.port}}

    if old_canary is not None and old_canary.version == version and old_canary.tag == tag:
        try:
            details["route"] = front.set_route(model, **route_to(old_canary))
        except ServingRuntimeError as exc:
            return failed(f"nginx: {exc.message}", retryable=exc.retryable)
        details["previous_versions"], details["port"] = [], old_canary.port
        return steps.ready()

    steps.begin(TargetState.LOADING)
    state = ServeState(root)
    green = serve.plan_instance(root, BentoStore(root).home, model=model, version=version, tag=tag)
    state.update(model, starting=green)
    before = front.routes().get(model) if front.is_split(model) else None
    try:
        green = serve.start_ready(green, load_timeout, lambda started: state.update(model, starting=started))
        steps.done("load_seconds")
        if payload.get("sample_input"):
            steps.begin(TargetState.VERIFYING)
            serve.smoke_request(green, payload["sample_input"], payload.get("signature") or {})
            steps.done("smoke_seconds")
        steps.begin(TargetState.CUTTING_OVER)
        front.set_route(model, **route_to(green))
        if before is None:
            front.split(model)  # the old workers keep sending every request to blue until they exit
    except ServingRuntimeError as exc:
        green = exc.instance if isinstance(exc, serve.StartFailed) else green
        try:
            if before is not None:
                front.set_route(model, **{k: v for k, v in before.items() if k != "ports"},
                                ports={int(v): p for v, p in (before.get("ports") or {}).items()})
            elif not front.is_split(model):
                front.remove_route(model)
        except ServingRuntimeError as back:
            logger.error("could not restore the route of %s: %s", model, back.message)
        discard_instance(state, model, green)
        return failed(f"{model} version {version} ({tag}) did not start as a canary: {exc.message}",
                      retryable=exc.retryable)
    state.update(model, canary=green, starting=None, draining=old_canary)
    details["port"] = green.port
    details["previous_versions"] = [old_canary.version] if old_canary is not None else []
    try:
        details["route"] = front.routes().get(model)
        if old_canary is not None:
            front.wait_idle(model, old_canary.version, timeout=unload_timeout)
            serve.stop_instance(old_canary, timeout=unload_timeout)
            shutil.rmtree(old_canary.home, ignore_errors=True)
    except ServingRuntimeError as exc:
        logger.error("%s v%s serves as a canary, but the old canary did not stop: %s", model, version, exc.message)
        details["drain_error"] = exc.message
        return steps.ready()
    state.update(model, draining=None)
    steps.done("cutover_seconds")
    return steps.ready()


def _end_split(root: Path, front: NginxFront, model: str, steps: DeploySteps, *, keep: serve.Instance,
               other: serve.Instance, unload_timeout: float) -> dict:
    """End a split model's canary without a reload: every request to ``keep`` (the canary, for a promotion;
    the stable version, for a rollback), then ``other`` stops once no request is on its way to it.

    Returns:
        As ``deploy_bentoml_version``; ``previous_versions`` is [``other``'s version], ``route`` the route
        nginx now holds (the kept version alone).
    """
    details, failed = steps.details, steps.failed
    steps.begin(TargetState.CUTTING_OVER)
    try:
        front.set_route(model, stable=keep.version, ports={keep.version: keep.port})
    except ServingRuntimeError as exc:
        return failed(f"nginx: {exc.message}", retryable=exc.retryable)
    state = ServeState(root)
    state.update(model, serving=keep, canary=None, draining=other)
    details.update(previous_versions=[other.version], kept_versions=[], port=keep.port)
    try:
        details["route"] = front.routes().get(model)
        front.wait_idle(model, other.version, timeout=unload_timeout)
        serve.stop_instance(other, timeout=unload_timeout)
        shutil.rmtree(other.home, ignore_errors=True)
    except ServingRuntimeError as exc:
        logger.error("%s v%s serves alone, but v%s did not stop: %s", model, keep.version, other.version, exc.message)
        details["drain_error"] = exc.message
        return steps.ready()
    state.update(model, draining=None)
    steps.done("cutover_seconds")
    return steps.ready()


def route_bentoml_model(payload: dict, *, root: Path) -> dict:
    """Change a split model's route (``contract.RoutePayload``: stable, canary, percent, shadow, shadow_percent)
    with no reload, once every version it names runs here; returns the route nginx now holds.

    Raises:
        ServingRuntimeError: nginx has no Lua module, the model has no canary here, a version it names does
            not run here (not retryable), or nginx does not answer (retryable).
    """
    root, model = Path(root), payload["model"]
    stable, canary, shadow = int(payload["stable"]), payload.get("canary"), payload.get("shadow")
    front = front_for(root, payload["inference_url"])
    front.ensure_running()
    if not front.splits:
        raise ServingRuntimeError("splitting a model's traffic needs nginx's Lua module: install Debian's "
                                  "libnginx-mod-http-lua and lua-cjson on this host", retryable=False)
    roles = ServeState(root).read().get(model, {})
    served = {instance.version: instance for role in ("serving", "canary")
              if (instance := roles.get(role)) is not None and serve.is_running(instance) and serve.is_ready(instance)}
    named = {int(v) for v in (stable, canary, shadow) if v is not None}
    missing = sorted(named - set(served))
    if missing:
        raise ServingRuntimeError(f"{model} version(s) {missing} are not served on this host (served: "
                                  f"{sorted(served)})", retryable=False)
    if not front.is_split(model):
        raise ServingRuntimeError(f"{model} has no canary on this host (deploy one with canary_percent first)",
                                  retryable=False)
    return front.set_route(model, stable=stable, canary=None if canary is None else int(canary),
                           percent=float(payload.get("percent") or 0), shadow=None if shadow is None else int(shadow),
                           shadow_percent=float(payload.get("shadow_percent") or 0),
                           ports={v: served[v].port for v in named})


def unload_bentoml_model(payload: dict, *, root: Path, timeout: float = 120.0) -> int | None:
    """Stop serving a model on this host: nginx stops routing ``/<model>/`` (gracefully), its
    requests finish, then every instance of it stops. The Bento stays in the store.

    Args:
        payload: ``{"model", "inference_url"}``.
        root: the agent's BentoML directory.
        timeout: seconds allowed for in-flight requests to finish and the processes to stop.

    Returns:
        The version that was served, or None when none was.

    Raises:
        ServingRuntimeError: nginx refused the change or the old processes did not stop.
    """
    root, model = Path(root), payload["model"]
    front = front_for(root, payload["inference_url"])
    front.ensure_running()
    roles = ServeState(root).read().get(model, {})
    if front.splits:
        front.remove_route(model)
    front.wait_drained(front.remove(model), timeout=timeout)
    for instance in roles.values():
        serve.stop_instance(instance, timeout=timeout)
        shutil.rmtree(instance.home, ignore_errors=True)
    ServeState(root).update(model, serving=None, canary=None, starting=None, draining=None)
    served = roles.get("serving")
    return served.version if served else None
