"""Request capture on the hosts: carry a model's capture settings (``registry.capture``) to the gateway of
every Triton host that serves it, repair a gateway that holds other settings, and read what each host
reports having captured.

The settings travel in the model's route (``contract.RoutePayload.capture``, an agent ``ROUTE`` task): a
host that runs a canary of the model gets the canary's route with them, any other host the route of the
version it serves (``canary`` None). Only agents of ``CAPTURE_PROTOCOL`` or newer with a live gateway get
them; any other host serving the model is named in a warning (it captures nothing). The reconciler sends
the route again to a host whose gateway reports other settings (``resend_capture``), so a host that starts
serving a captured model, a restarted gateway or a lost task is repaired within a heartbeat or two.

Captured bodies stay on the hosts: the orchestrator only ever sees counts and times.
"""

from __future__ import annotations

from django.db import transaction

from deployments.choices import CanaryState
from deployments.enqueue import send_to_host
from deployments.models import DeploymentTarget
from deployments.routes import (
    capture_differs,
    reported_capture,
    reported_route,
    route_payload,
    wanted_capture,
    why_no_capture,
)
from deployments.served import serving_now
from modelyard.celery import broker
from modelyard_agent.contract import AgentTask, Runtime


def _canary_of(target: DeploymentTarget) -> bool:
    deployment = target.deployment
    return (deployment.canary_state == CanaryState.ACTIVE and target.previous_version_id is not None
            and target.previous_version_id != deployment.version_id)


def capture_route(target: DeploymentTarget) -> dict:
    """The ``contract.RoutePayload`` that sets the capture of ``target``'s model on its host, with the route
    the host should hold: the canary's (``routes.route_payload``) under an active canary, else the
    version ``target`` serves alone."""
    deployment = target.deployment
    capture = wanted_capture(deployment.model)
    if _canary_of(target):
        return {**route_payload(target, deployment.canary_percent or 0, deployment.shadow_percent),
                "capture": capture}
    host = target.host
    return {"host": host.name, "runtime": host.runtime, "model": target.runtime_name,
            "inference_url": host.inference_url, "metrics_url": host.metrics_url,
            "stable": deployment.version.version, "canary": None, "percent": 0.0, "shadow": None,
            "shadow_percent": 0.0, "capture": capture}


def _serving_targets(model=None, hosts=None) -> list[DeploymentTarget]:

    filters = {"host__runtime": Runtime.TRITON}
    if model is not None:
        filters["deployment__model"] = model
    if hosts is not None:
        filters["host__in"] = hosts
    targets = serving_now(**filters)
    prefetched = DeploymentTarget.objects.filter(pk__in=[t.pk for t in targets]).select_related(
        "host", "previous_version", "deployment__model", "deployment__version")
    return sorted(prefetched, key=lambda t: (t.host.name, t.deployment.model.name))


def on_capture_changed(sender, model, before, after, actor=None, **kwargs) -> list[str]:
    """Receiver of ``registry.signals.capture_changed``: send the new settings to every Triton host serving
    ``model`` that can capture, on commit; returns a warning per serving host that cannot (see
    ``why_no_capture``), and one naming the BentoML hosts serving it (only Triton gateways capture)."""

    warnings, payloads = [], []
    bento_hosts = sorted({t.host.name for t in serving_now(host__runtime=Runtime.BENTOML, deployment__model=model)})
    if bento_hosts and after.get("fraction", 0) > 0:
        warnings.append(f"{', '.join(bento_hosts)} serve{'s' if len(bento_hosts) == 1 else ''} {model.name} with "
                        "BentoML, which captures nothing: request capture (and so replays) runs on Triton hosts only")
    for target in _serving_targets(model=model):
        reason = why_no_capture(target.host)
        if reason:
            warnings.append(reason)
        else:
            payloads.append((target.host.name, capture_route(target)))
    transaction.on_commit(lambda: [send_to_host(host, AgentTask.ROUTE, payload) for host, payload in payloads],
                          robust=True)  # resend_capture sends it again
    return warnings


def resend_capture(*, now=None, backoff: float = 30.0) -> list[tuple[str, str]]:
    """Send the capture route again to every online Triton host able to capture whose gateway reported other
    settings for a model it serves than the registry holds. At most once per ``backoff`` seconds per
    (host, model), shared through the broker's Redis with the canaries' route repair.

    Returns:
        The (host, model) pairs a route was sent to.
    """

    sent = []
    for target in _serving_targets():
        host = target.host
        if not host.is_online(now=now) or why_no_capture(host) or not capture_differs(target):
            continue
        if _canary_of(target) and reported_route(target).get("canary") != target.deployment.version.version:
            continue  # the canaries' repair sends this host its route, capture included
        key = f"modelyard:route-repair:{host.name}:{target.runtime_name}"
        if not broker().set(key, "1", nx=True, ex=max(1, int(backoff))):
            continue
        send_to_host(host.name, AgentTask.ROUTE, capture_route(target))
        sent.append((host.name, target.runtime_name))
    return sent


def capture_panel(model) -> dict:
    """What the model page and the API show of ``model``'s capture: ``{"settings": CaptureSettings,
    "hosts": [{"host", "requests", "bytes", "oldest", "newest", "skipped", "applied" (the gateway holds the
    registry's settings), "problem" (why it cannot capture, or None)}]}`` for each Triton host serving it,
    from the hosts' last heartbeats (times in unix seconds, bytes on disk)."""
    rows = []
    for target in _serving_targets(model=model):
        have = reported_capture(target.host, target.runtime_name) or {}
        rows.append({"host": target.host.name, "requests": have.get("requests"), "bytes": have.get("bytes"),
                     "oldest": have.get("oldest"), "newest": have.get("newest"), "skipped": have.get("skipped"),
                     "applied": not capture_differs(target), "problem": why_no_capture(target.host)})
    return {"settings": wanted_capture(model), "hosts": rows}
