"""Host-side work of a BentoML host agent: import a version into the Bento Store, swap blue/green.

Runs on the serving host; like the Triton agent (``modelyard_agent.triton_host``) it needs no database or
S3 credentials, only the payload built by ``build_agent_payload``.

A swap of model M from the version that serves (blue) to a new one (green):

1. download the archive (size and sha256 checked) and import it into the host's store
   (``runtimes.bento_store``, under the host-wide lock);
2. record green as M's ``starting`` instance in the state file, then start ``bentoml serve`` for its
   exact tag on a free port with its own BENTOML_HOME, and wait for /readyz;
3. send the version's sample input to it, when the version has one;
4. point nginx's upstream for ``/M/`` at green with a graceful reload; record green as serving;
5. wait until nginx's old workers finished their requests (blue is drained), stop blue's whole
   process group and check its port is free.

A failure up to step 4 stops green and leaves blue serving untouched. The state file
(``<root>/serving.json``: per model ``serving``, ``starting`` and ``draining`` instances) lets a
restarted agent finish or undo a swap its predecessor died in (``recover_model``): whichever
instance nginx routes to and answers /readyz is kept, every other instance of the model is stopped.
A Bento model (``.bentomodel``) is imported into the store only: it has no service to serve.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from modelyard_agent.contract import BENTO, BENTO_MODEL, TargetState
from modelyard_agent.downloads import download
from modelyard_agent.runtimes import bentoml as serve
from modelyard_agent.runtimes.base import ServingRuntimeError, StagingError
from modelyard_agent.runtimes.bento_store import BentoStore, file_lock
from modelyard_agent.runtimes.nginx import NginxFront
from modelyard_agent.runtimes.nginx_process import listen_address
from modelyard_agent.runtimes.routes import lua_available
from modelyard_agent.steps import DeploySteps

logger = logging.getLogger(__name__)

ROLES = ("serving", "canary", "starting", "draining")
# Seconds nginx keeps an idle client connection open, where its Lua module drains each reload first.
DEFAULT_KEEPALIVE = 75


class ServeState:
    """The state file of one host's BentoML agent: which instance of each model has which role.

    Every change is a read-modify-write under ``serving.json.lock`` and an atomic replace.
    """

    def __init__(self, root: Path):
        self.path = Path(root) / "serving.json"

    def read(self) -> dict[str, dict[str, serve.Instance]]:
        """{model: {role: Instance}} as last written."""
        if not self.path.exists():
            return {}
        raw = json.loads(self.path.read_text())
        return {model: {role: serve.Instance(**data) for role, data in roles.items() if data}
                for model, roles in raw.get("models", {}).items()}

    def update(self, model: str, **roles: serve.Instance | None) -> None:
        """Set (or, with None, clear) roles of ``model``'s instances."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(self.path.with_name("serving.json.lock")):
            state = json.loads(self.path.read_text()) if self.path.exists() else {"models": {}}
            entry = state["models"].setdefault(model, {})
            for role, instance in roles.items():
                if instance is None:
                    entry.pop(role, None)
                else:
                    entry[role] = instance.as_dict()
            if not entry:
                del state["models"][model]
            partial = self.path.with_suffix(".partial")
            partial.write_text(json.dumps(state, indent=1, sort_keys=True))
            partial.replace(self.path)


def front_for(root: Path, inference_url: str) -> NginxFront:
    """The host's nginx, listening on the port (and, for a loopback URL, the address) of ``inference_url``;
    ``MODELYARD_AGENT_NGINX_KEEPALIVE`` sets its client keep-alive in seconds. The default is
    ``DEFAULT_KEEPALIVE`` where nginx's Lua module is installed (each reload is drained first, so a kept-alive
    client loses no request to it) and 0 (every answer says ``Connection: close``) where it is not."""
    port, listen_host = listen_address(inference_url)
    default = DEFAULT_KEEPALIVE if lua_available() else 0
    return NginxFront(root, port, listen_host=listen_host,
                      client_keepalive=float(os.environ.get("MODELYARD_AGENT_NGINX_KEEPALIVE", default)))


def recover_model(root: Path, front: NginxFront, model: str) -> serve.Instance | None:
    """Leave exactly one instance of ``model`` serving, after a crash or at any time; returns it.

    The instance kept is the one nginx's files route to when it is ready, else the recorded ``serving``
    one when it is ready (nginx is pointed back at it, and reloaded onto it after a swap cut short);
    every other recorded instance is stopped.
    A serving instance whose ``bentoml serve`` arbiter died while an orphaned worker still answers
    is replaced blue/green first (``_replace_orphan``), so no request finds nothing behind nginx.
    """
    state = ServeState(root)
    roles = state.read().get(model, {})
    if front.is_split(model):
        return _recover_split(root, front, model, roles)
    routed = front.upstream_port(model)
    candidates = sorted(roles.values(), key=lambda i: (i.port != routed, i is not roles.get("serving")))
    keep = next((i for i in candidates if serve.is_running(i) and serve.is_ready(i)), None)
    orphan = roles.get("serving")
    if keep is None and orphan is not None and orphan.port == routed and serve.is_ready(orphan):
        keep = _replace_orphan(root, front, model, orphan)
    # A swap cut short (a ``starting`` instance recorded) may have written nginx's files without the reload that
    # serves them: then the files say ``keep`` while the running nginx still sends requests to an instance
    # stopped below. Reload to be sure.
    if keep is not None and (routed != keep.port or "starting" in roles):
        front.wait_drained(front.switch(model, keep.port, keep.version), timeout=front.shutdown_timeout)
    for role, instance in roles.items():
        if keep is None or instance.home != keep.home:
            logger.warning("stopping %s instance of %s v%s left by an earlier agent", role, model, instance.version)
            serve.stop_instance(instance)
            shutil.rmtree(instance.home, ignore_errors=True)
    state.update(model, serving=keep, canary=None, starting=None, draining=None)
    return keep


def _recover_split(root: Path, front: NginxFront, model: str,
                   roles: dict[str, serve.Instance]) -> serve.Instance | None:
    """``recover_model`` for a split model: keep its stable (``serving``) and ``canary`` instances that run and
    are ready, make its route name exactly those (a lost canary's share goes back to the stable version; a
    lost stable version leaves the canary as the one version served), stop every other instance.

    Returns:
        The instance now recorded ``serving``, or None when neither runs (the route is dropped; the next
        deployment of the model switches nginx to a plain location again).
    """
    state = ServeState(root)
    if "starting" in roles:
        # A first canary cut short may have made the files split without the reload that serves them: the
        # running nginx would keep its plain location, and a later promotion stop the process it names.
        front.reload()
    alive = {role: instance for role in ("serving", "canary")
             if (instance := roles.get(role)) is not None and serve.is_running(instance) and serve.is_ready(instance)}
    stable = alive.get("serving") or alive.get("canary")
    canary = alive.get("canary") if "serving" in alive else None
    route = front.routes().get(model) or {}
    if stable is None:
        front.remove_route(model)
    else:
        want = {"stable": stable.version, "canary": canary.version if canary else None,
                "ports": {str(i.version): i.port for i in (stable, canary) if i is not None}}
        if any(route.get(key) != value for key, value in want.items()):
            ours = canary is not None and route.get("canary") == canary.version
            front.set_route(model, stable=stable.version, canary=want["canary"],
                            percent=float(route.get("percent") or 0) if ours else 0.0,
                            shadow=route.get("shadow") if ours else None,
                            shadow_percent=float(route.get("shadow_percent") or 0) if ours else 0.0,
                            ports={i.version: i.port for i in (stable, canary) if i is not None})
    kept = {i.home for i in (stable, canary) if i is not None}
    kept_versions = {i.version for i in (stable, canary) if i is not None}
    for role, instance in roles.items():
        if instance.home not in kept:
            logger.warning("stopping %s instance of %s v%s left by an earlier agent", role, model, instance.version)
            if instance.version not in kept_versions:  # e.g. a promotion cut short while its old version drained
                try:
                    front.wait_idle(model, instance.version, timeout=front.shutdown_timeout)
                except ServingRuntimeError as exc:
                    logger.error("stopping %s v%s with requests in flight: %s", model, instance.version, exc.message)
            serve.stop_instance(instance)
            shutil.rmtree(instance.home, ignore_errors=True)
    state.update(model, serving=stable, canary=canary, starting=None, draining=None)
    return stable


def _replace_orphan(root: Path, front: NginxFront, model: str, orphan: serve.Instance) -> serve.Instance | None:
    """Start a new instance of the orphan's exact tag, switch nginx to it once ready, return it.

    BentoML 1.4's worker outlives a SIGKILLed arbiter and keeps answering for 20-40 s before it
    goes too; stopping it first would leave nginx with nothing to send requests to until a new
    process serves (about 20 s of 502s, measured). The orphan serves until its replacement answers
    ``/readyz``; ``recover_model`` then stops it (its processes are found by their BENTOML_HOME).

    Returns:
        The new instance, now routed and recorded ``serving``; None when it did not come up (the
        caller falls back to stopping everything, and the reconciler redeploys the model).
    """
    state = ServeState(root)
    green = serve.plan_instance(root, BentoStore(root).home, model=model, version=orphan.version, tag=orphan.tag)
    state.update(model, starting=green)
    logger.warning("the bentoml serve arbiter of %s v%s died; starting a replacement beside its orphaned worker",
                   model, orphan.version)
    try:
        green = serve.start_instance(green)
        state.update(model, starting=green)
        serve.wait_ready(green, timeout=front.shutdown_timeout)
        front.wait_drained(front.switch(model, green.port, green.version), timeout=front.shutdown_timeout)
    except ServingRuntimeError as exc:
        logger.error("could not replace the orphaned %s v%s: %s", model, orphan.version, exc.message)
        _discard(state, model, green)
        return None
    state.update(model, serving=green, starting=None, draining=orphan)
    return green


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
        green = serve.start_instance(green)
        state.update(model, starting=green)
        serve.wait_ready(green, timeout=load_timeout)
        steps.done("load_seconds")
        if payload.get("sample_input"):
            steps.begin(TargetState.VERIFYING)
            serve.smoke_request(green, payload["sample_input"], payload.get("signature") or {})
            steps.done("smoke_seconds")
        steps.begin(TargetState.CUTTING_OVER)
        old_workers = front.switch(model, green.port, version)
    except ServingRuntimeError as exc:
        if blue is not None and front.upstream_port(model) == green.port:
            try:  # the switch went half way (e.g. the reload was slow): route back before green stops
                back_to = front.split(model) if was_split else front.switch(model, blue.port, blue.version)
                front.wait_drained(back_to, timeout=unload_timeout)
            except ServingRuntimeError as back:
                logger.error("could not route %s back to version %s: %s", model, blue.version, back.message)
        _discard(state, model, green)
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
        green = serve.start_instance(green)
        state.update(model, starting=green)
        serve.wait_ready(green, timeout=load_timeout)
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
        try:
            if before is not None:
                front.set_route(model, **{k: v for k, v in before.items() if k != "ports"},
                                ports={int(v): p for v, p in (before.get("ports") or {}).items()})
            elif not front.is_split(model):
                front.remove_route(model)
        except ServingRuntimeError as back:
            logger.error("could not restore the route of %s: %s", model, back.message)
        _discard(state, model, green)
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


def tidy_models(root: Path, inference_url: str, lock_for: Callable[[str], object]) -> list[str]:
    """Finish or undo what a dead agent left (``recover_model``) for every model whose state records a
    ``starting`` or ``draining`` instance, or a ``serving`` one that no longer runs.

    Args:
        root: the agent's BentoML directory.
        inference_url: the host's inference URL (nginx's address).
        lock_for: model name -> its (host, model) lock (``acquire(blocking=False)``, ``release()``);
            a model whose lock is held, i.e. being deployed right now, is left alone.

    Returns:
        The models tidied.
    """
    front, tidied = None, []
    for model, roles in sorted(ServeState(root).read().items()):
        if set(roles) <= {"serving", "canary"} and "serving" in roles \
                and all(serve.is_running(instance) for instance in roles.values()):
            continue
        lock = lock_for(model)
        if not lock.acquire(blocking=False):
            continue
        try:
            if front is None:
                front = front_for(root, inference_url)
                front.ensure_running()
            recover_model(root, front, model)
            tidied.append(model)
        except ServingRuntimeError as exc:
            logger.error("could not tidy %s: %s", model, exc.message)
        finally:
            lock.release()
    return tidied


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


def import_into_store(payload: dict, store: BentoStore, *, kind: str, tag: str, timeout: float) -> bool:
    """Download a version's artifact (size and sha256 checked) and import it into the host's store.

    Args:
        payload: a deploy or profile payload (artifact_url, sha256, size in bytes).
        store: the host's Bento Store.
        kind: ``BENTO`` or ``BENTO_MODEL``; tag: the BentoML tag the version records.
        timeout: seconds allowed between bytes of the download, and for the import.

    Returns:
        True when imported now, False when the store already held it (same sha256).

    Raises:
        StagingError: no tag, or the download or import failed.
    """
    if not tag:
        raise StagingError("the version records no BentoML tag; it was not registered as a BentoML archive")
    store.root.mkdir(parents=True, exist_ok=True)
    with file_lock(store.root / "store.lock"):
        if store.is_imported(kind, tag, payload["sha256"]):
            return False
    work = store.new_work_dir(prefix="dl-")
    try:
        archive = work / "artifact"
        download(payload["artifact_url"], archive, sha256=payload["sha256"], size=int(payload["size"]),
                  timeout=timeout)
        return store.import_archive(archive, kind=kind, tag=tag, sha256=payload["sha256"], timeout=timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _discard(state: ServeState, model: str, instance: serve.Instance) -> None:
    try:
        serve.stop_instance(instance)
    except ServingRuntimeError as exc:
        logger.error("could not stop failed instance of %s: %s", model, exc.message)
        return
    shutil.rmtree(instance.home, ignore_errors=True)
    state.update(model, starting=None)


def stop_host(root: Path, inference_url: str, timeout: float = 30.0) -> list[str]:
    """Stop everything a BentoML host agent started on this host (when the host goes down): every
    ``bentoml serve`` instance, recorded in the state file or still running in a home under
    ``<root>/instances``, then its nginx. The state file then records nothing serving, so the next
    agent's heartbeat reports no model and the reconciler deploys the served versions again.
    The Bento Store is kept. Idempotent.

    Args:
        root: the agent's BentoML directory.
        inference_url: the host's inference URL (nginx's address).
        timeout: seconds each instance and nginx may take to stop.

    Returns:
        The homes of the instances stopped.

    Raises:
        ServingRuntimeError: a port stayed taken after its processes were gone, or nginx refused to quit.
    """
    root = Path(root)
    state = ServeState(root)
    recorded = state.read()
    instances = {i.home: i for roles in recorded.values() for i in roles.values()}
    for home in sorted((root / "instances").glob("*")) if (root / "instances").is_dir() else []:
        if str(home) not in instances and serve.processes_of(str(home)):  # no port recorded: none to wait for
            instances[str(home)] = serve.Instance(model="", version=0, tag="", port=0, home=str(home))
    stopped = []
    for home, instance in sorted(instances.items()):
        if serve.processes_of(home) or (instance.pid and serve.is_running(instance)):
            stopped.append(home)
        serve.stop_instance(instance, timeout=timeout)
    for model in recorded:
        state.update(model, serving=None, canary=None, starting=None, draining=None)
    front_for(root, inference_url).stop(timeout=timeout)
    return stopped


def collect_bentoml_heartbeat(*, inference_url: str, root: Path, labels: dict) -> dict:
    """What a BentoML host agent reports, in the Triton agent's shape; never raises.

    Returns:
        ``{"runtime_live": nginx answers, "runtime_version": "bentoml <version>", "models":
        [{"name", "version", "state": "READY" or "UNAVAILABLE"}], "gpus": [], "disk_free_bytes",
        "labels", "errors"}``.
    """
    root = Path(root)
    front = front_for(root, inference_url)
    report: dict = {"runtime_live": front.is_live(), "runtime_version": f"bentoml {metadata.version('bentoml')}",
                    "models": [], "gpus": [], "disk_free_bytes": None, "labels": labels, "errors": []}
    try:
        for model, roles in sorted(ServeState(root).read().items()):
            for instance in (roles.get("serving"), roles.get("canary")):
                if instance is not None:
                    ready = serve.is_running(instance) and serve.is_ready(instance)
                    report["models"].append({"name": model, "version": instance.version,
                                             "state": "READY" if ready else "UNAVAILABLE"})
    except (OSError, ValueError) as exc:
        report["errors"].append(f"state file: {exc}")
    if front.splits:
        try:
            report["gateway"] = {"live": report["runtime_live"], "routes": front.routes()}
        except ServingRuntimeError as exc:
            report["gateway"] = {"live": False, "routes": {}}
            report["errors"].append(f"gateway: {exc.message}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        report["disk_free_bytes"] = shutil.disk_usage(root).free
    except OSError as exc:
        report["errors"].append(f"{root}: {exc}")
    return report
