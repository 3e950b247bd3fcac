"""Supervision of a BentoML host's ``bentoml serve`` instances: the state file that records which instance of
each model has which role (``ServeState``), and what keeps the instances, nginx and that file in agreement:
recovery of what a dead agent left (``recover_model``, ``tidy_models``), stopping the host (``stop_host``)
and the heartbeat's report of what runs (``collect_bentoml_heartbeat``).

The state file (``<root>/serving.json``: per model ``serving``, ``canary``, ``starting`` and ``draining``
instances) lets a restarted agent finish or undo a swap its predecessor died in (``recover_model``):
whichever instance nginx routes to and answers /readyz is kept, every other instance of the model is stopped.
The swaps that write it are in ``bentoml_host``.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from modelyard_agent.config import current as settings
from modelyard_agent.runtimes import bentoml as serve
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.bento_store import BentoStore, file_lock
from modelyard_agent.runtimes.nginx import NginxFront
from modelyard_agent.runtimes.nginx_process import listen_address
from modelyard_agent.runtimes.routes import lua_available

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


def front_for(root: Path, inference_url: str, *, client_keepalive: float | None = None) -> NginxFront:
    """The host's nginx, listening on the port (and, for a loopback URL, the address) of ``inference_url``.

    ``client_keepalive`` (seconds; None: the agent's ``--nginx-keepalive`` setting, ``config``) sets its client
    keep-alive. Without either, it is ``DEFAULT_KEEPALIVE`` where nginx's Lua module is installed (each reload
    is drained first, so a kept-alive client loses no request to it) and 0 (every answer says
    ``Connection: close``) where it is not."""
    port, listen_host = listen_address(inference_url)
    if client_keepalive is None:
        client_keepalive = settings().nginx_keepalive
    if client_keepalive is None:
        client_keepalive = DEFAULT_KEEPALIVE if lua_available() else 0
    return NginxFront(root, port, listen_host=listen_host, client_keepalive=float(client_keepalive))


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
        green = serve.start_ready(green, front.shutdown_timeout,
                                  lambda started: state.update(model, starting=started))
        front.wait_drained(front.switch(model, green.port, green.version), timeout=front.shutdown_timeout)
    except ServingRuntimeError as exc:
        green = exc.instance if isinstance(exc, serve.StartFailed) else green
        logger.error("could not replace the orphaned %s v%s: %s", model, orphan.version, exc.message)
        discard_instance(state, model, green)
        return None
    state.update(model, serving=green, starting=None, draining=orphan)
    return green


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


def discard_instance(state: ServeState, model: str, instance: serve.Instance) -> None:
    """Stop ``instance`` of ``model`` that did not take over (logged when it does not stop), remove its home
    and clear the model's ``starting`` role."""
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
    # Stopping reads no keep-alive, so no agent setting: manage.py stop_bentoml_host runs this outside an agent.
    front_for(root, inference_url, client_keepalive=0.0).stop(timeout=timeout)
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
