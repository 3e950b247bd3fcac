"""The Triton host adapter: a model repository on disk, explicit model control over gRPC (HTTP without a
gRPC address), ``modelyard_agent.triton_host``; with ``--triton-url``, the host's gateway in front of it
(``runtimes.gateway.TritonGateway``), which takes the routes, request limits and captures."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from modelyard_agent.adapters.common import direct, load_deadline, running_profiles, running_tasks, unload_deadline
from modelyard_agent.adapters.on_demand import (
    ON_DEMAND,
    deploy_cold,
    model_lock,
    register_residency,
    registered_not_resident,
)
from modelyard_agent.capture import enforce as enforce_capture
from modelyard_agent.config import current as settings
from modelyard_agent.footprints import version_footprints
from modelyard_agent.formats.request_limits import RequestLimit, request_limit
from modelyard_agent.formats.triton_config import ModelConfigError
from modelyard_agent.profiling.triton import profile_triton_version, remove_stale_copies
from modelyard_agent.replay.triton import remove_stale_replay_copies, replay_triton_version
from modelyard_agent.residency import OnDemandLoader
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.gateway import TritonGateway
from modelyard_agent.runtimes.nginx_process import listen_address
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_heartbeat import collect_heartbeat
from modelyard_agent.triton_host import deploy_triton_version
from modelyard_agent.triton_staging import AgentPaths

logger = logging.getLogger(__name__)


def triton_gateway(inference_url: str):
    """The host's gateway (``runtimes.gateway.TritonGateway``) at ``--gateway-listen``, else at the port of
    ``inference_url`` (its address, for a loopback URL), in front of the agent's ``--triton-url``; None when the
    agent runs without one."""

    if not settings().triton_url:
        return None
    port, listen_host = listen_address(inference_url, settings().gateway_listen)
    state_dir = AgentPaths(Path(settings().model_repository), settings().staging_dir).state_dir
    return TritonGateway(state_dir / "gateway", port, triton=settings().triton_url.split("://", 1)[1],
                         listen_host=listen_host, grpc_listen=settings().gateway_grpc_listen,
                         triton_grpc=settings().triton_grpc_url, max_request_bytes=settings().max_request_bytes)


def gateway_request_limit(gateway: TritonGateway, payload: dict):
    """The body limit of ``payload``'s version on ``gateway`` (``formats.request_limits.RequestLimit``): the
    deployment's ``max_request_bytes``, else its signature's bound, else the host's ``--max-request-bytes``
    (also when the config does not parse: the load then reports why)."""

    try:
        return request_limit(payload.get("config_text") or "", overrides=payload.get("config_overrides"),
                             host_default=gateway.max_request_bytes,
                             deployment_limit=payload.get("max_request_bytes"))
    except ModelConfigError:
        return RequestLimit(gateway.max_request_bytes, "host")


def drain_routed(gateway: TritonGateway, model: str, *, kept: list[int], timeout: float,
                 poll: float = 0.02) -> list[str]:
    """Wait until no request a route gave a version of ``model`` outside ``kept`` is still on its way to Triton
    through the gateway; call it once the gateway holds the new route (which gives no such version), before
    those versions unload. ``timeout`` and ``poll`` in seconds, one deadline for every version.

    Returns:
        What did not drain in time, one message per version (empty when every request ended, or when the
        running gateway counts nothing: one started from an earlier agent's config, which its next start
        replaces). A control socket that does not answer is asked again until the deadline.
    """

    deadline = time.monotonic() + timeout
    busy: dict[str, int] = {}
    problem = ""
    while True:
        try:
            busy = {key: count for key, count in gateway.inflight().items()
                    if count > 0 and key.split("/")[0] == model and not _kept(key.split("/")[1], kept)}
            problem = ""
        except ServingRuntimeError as exc:
            if not exc.retryable:
                return []
            problem = exc.message
        if not busy and not problem:
            return []
        if time.monotonic() > deadline:
            return [problem] if problem else [f"{count} request(s) to {key.replace('/', ' v')} still in flight after "
                                              f"{timeout:g} s" for key, count in sorted(busy.items())]
        time.sleep(poll)


def _kept(version: str, kept: list[int]) -> bool:
    """Whether requests counted in flight under ``version`` (a number, or ``*``: an on-demand model's requests
    that no route gave a version, which Triton answers with any) go to a version in ``kept``."""
    return version.isdigit() and int(version) in kept


class TritonHostAgent:
    """Triton: a model repository on disk, explicit load and unload over gRPC (over HTTP without a gRPC
    address), ``modelyard_agent.triton_host``; with ``--triton-url``, the host's gateway in front of it."""

    def deploy(self, payload: dict, *, report: Callable[[str], None]) -> dict:
        """As ``HostAgent.deploy``. A payload with ``canary_percent`` or ``shadow_percent`` keeps the version
        that served (the stable one) loaded beside the new one, routes ``canary_percent`` of the requests that
        name no version to the new one and mirrors ``shadow_percent`` of them to it (answers discarded); a
        payload with neither, on a model the gateway routes, sends every request to the new version before
        the others unload, then drops the route.

        A payload with ``residency`` "on_demand" registers the model on demand at the gateway (it keeps a route,
        and its requests are held while it is not resident): a model resident now is swapped as any other; one
        that is not is only staged (``triton_host.stage_on_demand``), to be loaded at its next request."""

        model, version = payload["model"], int(payload["version"])
        percent, shadow_percent = payload.get("canary_percent"), payload.get("shadow_percent")
        split = percent is not None or shadow_percent is not None
        on_demand = payload.get("residency") == ON_DEMAND
        gateway = triton_gateway(payload["inference_url"])
        if gateway is None and payload.get("inference_keys") is not None:
            return {"state": "failed", "retryable": False, "details": {}, "error": (
                "the model requires an inference key, which only the host's gateway checks: run this host's agent "
                "with --triton-url (MODELYARD_AGENT_TRITON_URL)")}
        if gateway is None and (split or on_demand):
            return {"state": "failed", "retryable": False, "details": {}, "error": (
                f"{'residency on_demand' if on_demand else 'a canary or shadow'} needs the host's gateway: run this "
                "host's agent with --triton-url (MODELYARD_AGENT_TRITON_URL) and register the gateway's address as "
                "the host's inference_url")}
        route, captured, limit, held_limit = None, False, None, None
        if gateway is not None:
            try:
                gateway.ensure_running()
                if "inference_keys" in payload:  # before the version serves: a keyed model is never open
                    gateway.set_inference_keys({model: payload["inference_keys"]})
                route = gateway.routes().get(model)
                # A captured model keeps a route to the version that serves, so each captured request
                # names the version that answered it.
                captured = model in gateway.capture()
                limit = gateway_request_limit(gateway, payload)
                held_limit = gateway.request_limits()["models"].get(model)
                # While the versions overlap either may answer, so the larger of their limits holds.
                gateway.set_request_limit(model, max(limit.bytes, held_limit or 0))
            except ServingRuntimeError as exc:
                return {"state": "failed", "retryable": exc.retryable, "details": {},
                        "error": f"the host's gateway: {exc.message}"}
        if on_demand:
            cold = deploy_cold(gateway, payload, route=route if split else None, limit=limit)
            if cold is not None:
                return cold

        def keep(previous: list[int]) -> list[int]:
            if not split or not previous:
                return []
            stable = route["stable"] if route and route["stable"] in previous else max(previous)
            return [stable]

        drain_errors: list[str] = []
        series_errors: list[str] = []

        def before_cutover(kept: list[int]) -> None:
            gateway.set_request_limit(model, max(limit.bytes, held_limit or 0) if kept else limit.bytes)
            if kept:
                gateway.set_route(model, stable=kept[0], canary=version, percent=float(percent or 0),
                                  shadow=version if shadow_percent else None, shadow_percent=float(shadow_percent or 0))
            elif route is not None or captured or on_demand:
                gateway.set_route(model, stable=version)
            else:
                # Served without a route: its traffic series start at 0 now, as a routed version's do when its
                # route is applied, so a burst before the next scrape counts. Only measurement depends on it.
                try:
                    gateway.create_series(model, [version])
                except ServingRuntimeError as exc:
                    series_errors.append(exc.message)
            # A request the old route gave a version that now unloads may still be on its way to Triton.
            drain_errors.extend(drain_routed(gateway, model, kept=[*kept, version], timeout=unload_deadline(payload)))

        result = deploy_triton_version(
            direct(payload), model_repository=Path(settings().model_repository), report=report,
            load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload),
            grpc_url=settings().triton_grpc_url, staging_dir=settings().staging_dir,
            keep=keep, before_cutover=before_cutover if gateway is not None else None)
        if drain_errors:
            result["details"]["drain_error"] = "; ".join(drain_errors)
        if series_errors:
            result["details"]["series_error"] = "; ".join(series_errors)
        if gateway is not None and result["state"] != "ready":
            try:
                gateway.set_request_limit(model, held_limit)  # the versions from before serve, with their limit
            except ServingRuntimeError as exc:
                result["details"]["request_limit_error"] = exc.message
        if gateway is not None and result["state"] == "ready":
            result["details"]["request_limit"] = {"bytes": limit.bytes, "basis": limit.basis}
            try:
                if not result["details"].get("kept_versions") and route is not None and not captured and not on_demand:
                    gateway.remove_route(model)
                result["details"]["route"] = gateway.routes().get(model)
                result["details"]["residency"] = register_residency(
                    gateway, payload, resident=True, versions=[*result["details"].get("kept_versions", []), version])
            except ServingRuntimeError as exc:
                result["details"]["route_error"] = exc.message
        return result

    def route(self, payload: dict) -> dict:
        """Set ``payload["model"]``'s route on the host's gateway (``contract.RoutePayload``), once both of its
        versions are READY on Triton, and its request capture when the payload carries ``capture`` (with
        no canary or shadow, the version that serves is routed to alone while capture is on); returns the
        route the gateway holds.

        Raises:
            ServingRuntimeError: no gateway, a version not READY, or the gateway refused or did not answer.
        """

        gateway = triton_gateway(payload["inference_url"])
        if gateway is None:
            raise ServingRuntimeError("this host runs no gateway (start its agent with --triton-url)", retryable=False)
        model, stable, canary = payload["model"], int(payload["stable"]), payload.get("canary")
        shadow = payload.get("shadow")
        ready = TritonRuntime(settings().triton_url, timeout=10.0).ready_versions(model)
        missing = [v for v in (stable, canary, shadow) if v is not None and int(v) not in ready]
        if missing:
            raise ServingRuntimeError(f"{model} version(s) {missing} are not READY on this host (READY: {ready})",
                                      retryable=False)
        gateway.ensure_running()
        capture = payload.get("capture")
        if capture is not None and canary is None and shadow is None:
            # The model served by ``stable`` alone: routed to it while captured, passed as sent otherwise.
            if float(capture["fraction"]) > 0:
                route = gateway.set_route(model, stable=stable)
            else:
                held = gateway.routes().get(model)
                if held is not None and held.get("canary") is None and held.get("shadow") is None:
                    gateway.remove_route(model)
                route = gateway.routes().get(model) or {}
        else:
            route = gateway.set_route(model, stable=stable, canary=None if canary is None else int(canary),
                                      percent=float(payload.get("percent") or 0),
                                      shadow=None if shadow is None else int(shadow),
                                      shadow_percent=float(payload.get("shadow_percent") or 0))
        if capture is not None:
            gateway.set_capture(model, fraction=float(capture["fraction"]), max_bytes=int(capture["max_bytes"]),
                                retention_seconds=int(capture["retention_seconds"]))
        return route

    def set_inference_keys(self, payload: dict) -> dict:
        """As ``HostAgent.set_inference_keys``, on the host's gateway (started unless it runs).

        Raises:
            ServingRuntimeError: no gateway (not retryable), or the gateway refused the keys or did not answer.
        """

        gateway = triton_gateway(payload["inference_url"])
        if gateway is None:
            raise ServingRuntimeError("this host runs no gateway (start its agent with --triton-url): it cannot "
                                      "check inference keys", retryable=False)
        gateway.ensure_running()
        return gateway.set_inference_keys(payload["keys"])

    def heartbeat(self, request: dict) -> dict:
        """Start the gateway unless it runs, remove profile and replay copies no running profile or replay owns
        (``modelyard_agent.copies``), apply each captured model's retention and scope (``capture.enforce``),
        then report, with the gateway's routes, captures and on-demand residency; each version routed of an
        on-demand model that Triton does not hold now is reported with state "REGISTERED"."""

        errors, gateway_report = [], None
        gateway = triton_gateway(request["inference_url"]) if request.get("inference_url") else None
        if gateway is not None:
            try:
                gateway.ensure_running()
                gateway_report = {"live": True, "routes": gateway.routes()}
            except ServingRuntimeError as exc:
                gateway_report = {"live": False, "routes": {}}
                errors.append(f"gateway: {exc.message}")
        request = direct(request)
        if request.get("inference_url"):
            runtime = TritonRuntime(request["inference_url"], timeout=5.0, grpc_url=settings().triton_grpc_url)
            paths = AgentPaths(Path(settings().model_repository), settings().staging_dir)
            try:
                remove_stale_copies(runtime, paths, running_profiles(request["host"]))
                remove_stale_replay_copies(runtime, paths, running_tasks(request["host"], "replay_id"))
            except ServingRuntimeError as exc:
                errors.append(f"profile and replay copies: {exc.message}")
        report = collect_heartbeat(inference_url=request["inference_url"], metrics_url=request.get("metrics_url", ""),
                                   model_repository=Path(settings().model_repository), labels=settings().labels)
        if gateway_report is not None and gateway_report["live"]:
            served = ({m["name"] for m in report["models"] if m.get("state") == "READY"}
                      if report["runtime_live"] else None)
            try:
                gateway_report["capture"] = enforce_capture(gateway, served)
            except (ServingRuntimeError, OSError) as exc:
                errors.append(f"capture: {getattr(exc, 'message', exc)}")
        if gateway_report is not None and gateway_report["live"]:
            try:
                gateway_report["residency"] = gateway.residency()
                gateway_report["footprints"] = version_footprints(
                    AgentPaths(Path(settings().model_repository), settings().staging_dir).state_dir)
                report["models"] += registered_not_resident(gateway_report["residency"]["models"],
                                                            gateway_report["routes"], report["models"])
            except ServingRuntimeError as exc:
                errors.append(f"residency: {exc.message}")
        report["errors"] = report["errors"] + errors
        report["gateway"] = gateway_report
        return report

    def unload(self, payload: dict) -> None:

        gateway = triton_gateway(payload["inference_url"])
        if gateway is not None and gateway.master_pid() is not None:
            gateway.remove_route(payload["model"])
            # Before the unload: a model still registered on demand would be loaded again at its next request.
            if payload["model"] in gateway.residency()["models"]:
                gateway.unregister_on_demand(payload["model"])
            for problem in drain_routed(gateway, payload["model"], kept=[], timeout=unload_deadline(payload)):
                logger.warning("unloading %s with requests in flight: %s", payload["model"], problem)
        payload = direct(payload)
        runtime = TritonRuntime(payload["inference_url"], load_timeout=unload_deadline(payload),
                                grpc_url=settings().triton_grpc_url)
        versions = runtime.ready_versions(payload["model"])
        runtime.unload(payload["model"])
        runtime.wait_versions_gone(payload["model"], versions, timeout=unload_deadline(payload))

    def profile(self, payload: dict, *, progress, should_stop) -> dict:

        return profile_triton_version(
            direct(payload), paths=AgentPaths(Path(settings().model_repository), settings().staging_dir),
            perf_analyzer_binary=settings().perf_analyzer, progress=progress, should_stop=should_stop,
            load_timeout=load_deadline(payload), unload_timeout=unload_deadline(payload),
            grpc_url=settings().triton_grpc_url)


    def replay(self, payload: dict, *, progress, should_stop) -> dict:
        """As ``HostAgent.replay``: the captured requests are read from the host's gateway's capture directory
        and sent to Triton itself (``--triton-url``; ``inference_url`` when the agent runs no gateway)."""

        captured = capture_directory(payload["inference_url"], payload["model"])
        payload = direct(payload)
        return replay_triton_version(
            payload, paths=AgentPaths(Path(settings().model_repository), settings().staging_dir),
            triton_url=payload["inference_url"], capture_dir=captured,
            progress=progress, should_stop=should_stop, load_timeout=load_deadline(payload),
            unload_timeout=unload_deadline(payload), grpc_url=settings().triton_grpc_url)


def capture_directory(inference_url: str, model: str) -> Path:
    """Where this host's gateway (at ``inference_url``) captures ``model``'s requests:
    ``<gateway directory>/capture/<model>`` (``TritonGateway.capture_directory``)."""

    gateway = triton_gateway(inference_url)
    if gateway is None:
        return AgentPaths(Path(settings().model_repository), settings().staging_dir).state_dir / "gateway" / \
            "capture" / model
    return gateway.capture_directory(model)


def start_loader() -> OnDemandLoader | None:
    """Start this Triton host's on-demand loader (``modelyard_agent.residency``) in the agent's main process, or
    return None on a host without a gateway (``--triton-url``), where nothing can be held on demand."""

    config = settings()
    if not config.triton_url:
        return None
    # Only the gateway's control socket and files are used: the heartbeat starts the gateway itself.
    loader = OnDemandLoader(
        triton_gateway(config.triton_url),
        TritonRuntime(config.triton_url, load_timeout=config.load_deadline, grpc_url=config.triton_grpc_url),
        budget_bytes=config.memory_budget_bytes, metrics_url=config.triton_metrics_url,
        metrics_interval_ms=config.triton_metrics_interval_ms,
        state_dir=AgentPaths(Path(config.model_repository), config.staging_dir).state_dir,
        model_lock=model_lock, unload_timeout=config.unload_deadline, concurrent_loads=config.concurrent_loads)
    loader.start(timeout=0)  # the gateway may not run yet: the first heartbeat starts it
    return loader
