"""Weighted canaries: a new version beside the one each host serves, a share of the traffic sent to it.

A deployment with ``canary_percent`` P rolls out as usual, but each host's agent keeps the version it
served (the *stable* one, the target's ``previous_version``) loaded beside the new one, and the host's
gateway (``modelyard_agent.runtimes.gateway``) sends P % of the requests that name no version to the new
one. Requests that name a version reach it; a client sending ``X-Modelyard-Routing-Key`` stays on one
version while P stays.

- ``shadow_percent`` S mirrors S % of those requests to the new version as well (nginx's ``mirror``:
  its answers are discarded, so clients only see the stable and canary versions' answers). With P = 0 it
  is a *shadow* deployment: the new version gets mirrored traffic only, so Triton's per-version metrics
  of it are the shadow's own.
- ``set_traffic`` changes P and S on every host the canary reached (an agent ``ROUTE`` task each; no
  reload on the host), audited.
- ``promote_canary`` starts a plain rollout of the canary's version to those hosts: each agent first
  sends every request to it, then unloads the stable version.
- a rollback (``rollouts.rollback_rollout``) starts a plain rollout of each host's stable version: each
  agent first sends every request back to it, then unloads the canary.

Canaries need hosts whose agent speaks ``CANARY_PROTOCOL`` and reports a live gateway, each already serving a
version of the model: a Triton host whose agent runs the gateway (``--triton-url``), or a BentoML host whose
agent's nginx has the Lua module (``modelyard_agent.runtimes.nginx.NginxFront``: the stable and the canary
``bentoml serve`` processes side by side, the same route and routing-key scheme; its heartbeat's ``gateway``
block says it can split). The rollout planner checks that when a canary starts (``services.check_canary_hosts``),
and ends the canaries a plain rollout replaces (``services.end_canaries_replaced``); the routes sent and
read back are built in ``deployments.routes``.
"""

from __future__ import annotations

from django.db import transaction

from audit.choices import AuditAction
from audit.services import record_audit_event
from deployments.choices import CanaryState, DeploymentStatus, TargetState
from deployments.enqueue import send_to_host
from deployments.models import Deployment, DeploymentTarget
from deployments.routes import capture_differs, reported_route, route_payload, why_no_capture
from deployments.services import check_percent, create_rollout
from modelyard.celery import broker
from modelyard.errors import Conflict, InvalidInput
from modelyard_agent.contract import AgentTask


def _reached(deployment: Deployment) -> list[DeploymentTarget]:
    """The targets where the canary serves beside a stable version."""
    return list(deployment.targets.filter(state=TargetState.READY, previous_version__isnull=False)
                .exclude(previous_version=deployment.version_id)
                .select_related("host", "previous_version", "deployment__version", "deployment__model"))


def _active(deployment_id: int) -> Deployment:
    deployment = Deployment.objects.select_for_update().select_related("model", "version").get(pk=deployment_id)
    if deployment.canary_state != CanaryState.ACTIVE:
        state = deployment.get_canary_state_display().lower() if deployment.canary_state else "not a canary"
        raise Conflict(f"deployment {deployment_id} has no active canary ({state})")
    return deployment


def set_traffic(deployment_id: int, *, canary_percent=None, shadow_percent=None, actor=None) -> Deployment:
    """Send ``canary_percent`` of the requests that name no version to the canary, and mirror
    ``shadow_percent`` of them to it, on every host it reached; None leaves a share as it is.

    Hosts the rollout has not reached yet get the new shares with their deploy payload. Audited
    (``deployment.changed``, change ``canary_traffic``, with the shares before and after).

    Raises:
        InvalidInput: a share outside 0-100, or neither given.
        Conflict: the deployment has no active canary, or its rollout was cancelled or rolled back.
    """

    if canary_percent is None and shadow_percent is None:
        raise InvalidInput("give canary_percent, shadow_percent or both")
    canary_percent = None if canary_percent is None else check_percent(canary_percent, "canary_percent")
    shadow_percent = None if shadow_percent is None else check_percent(shadow_percent, "shadow_percent")
    with transaction.atomic():
        deployment = _active(deployment_id)
        if deployment.status in (DeploymentStatus.CANCELLED, DeploymentStatus.ROLLED_BACK):
            raise Conflict(f"deployment {deployment_id} was {deployment.get_status_display().lower()}")
        before = {"canary_percent": deployment.canary_percent, "shadow_percent": deployment.shadow_percent}
        if canary_percent is not None:
            deployment.canary_percent = canary_percent
        if shadow_percent is not None:
            deployment.shadow_percent = shadow_percent
        Deployment.objects.filter(pk=deployment.pk).update(canary_percent=deployment.canary_percent,
                                                           shadow_percent=deployment.shadow_percent)
        after = {"canary_percent": deployment.canary_percent, "shadow_percent": deployment.shadow_percent}
        targets = _reached(deployment)
        record_audit_event(
            action=AuditAction.DEPLOYMENT_CHANGED, actor=actor, obj_type="deployment", obj_id=deployment.pk,
            model=deployment.model, data={"change": "canary_traffic", "version": deployment.version.version,
                                          "from": before, "to": after, "hosts": [t.host.name for t in targets]})
        payloads = [(t.host.name, route_payload(t, deployment.canary_percent or 0, deployment.shadow_percent))
                    for t in targets]
        transaction.on_commit(lambda: [send_to_host(host, AgentTask.ROUTE, payload) for host, payload in payloads],
                              robust=True)  # resend_routes sends it again
    return deployment


def promote_canary(deployment_id: int, *, actor=None) -> Deployment:
    """Make the canary's version the only one on every host it reached: a plain rollout of it there
    (each agent sends every request to it before the stable version unloads), audited.

    Returns:
        The promotion rollout.

    Raises:
        Conflict: no active canary, or its rollout has not reached any host.
    """

    with transaction.atomic():
        deployment = _active(deployment_id)
        targets = _reached(deployment)
        if not targets:
            raise Conflict(f"the canary of deployment {deployment_id} serves on no host yet")
        promotion = create_rollout(
            model_version=deployment.version, hosts=[t.host for t in targets], batch_size=deployment.batch_size,
            failure_policy=deployment.failure_policy, config_overrides=deployment.config_overrides,
            autoscale=deployment.autoscale, max_request_bytes=deployment.max_request_bytes,
            **deployment.residency_settings(), actor=actor,
            reason=f"promote the canary of deployment {deployment.pk}",
        )
        # Rolling the promotion back returns each host to the version that was stable under the canary.
        for target in targets:
            DeploymentTarget.objects.filter(deployment=promotion, host=target.host).update(
                previous_version=target.previous_version)
        Deployment.objects.filter(pk=deployment.pk).update(canary_state=CanaryState.PROMOTED)
        record_audit_event(
            action=AuditAction.DEPLOYMENT_CHANGED, actor=actor, obj_type="deployment", obj_id=deployment.pk,
            model=deployment.model, data={"change": "canary_promoted", "version": deployment.version.version,
                                          "promotion": promotion.pk, "hosts": [t.host.name for t in targets]})
    return promotion


def canary_summary(deployment: Deployment, targets: list[DeploymentTarget] | None = None) -> dict | None:
    """What a page or the API shows of a canary: ``{"percent", "shadow_percent", "state", "version",
    "hosts": [{"host", "state", "stable", "applied_percent", "applied_shadow_percent"}]}`` where the applied
    shares are what the host's gateway last reported for the model (None before it reported). None for a
    deployment that is not a canary. Reads ``targets`` (default: the deployment's prefetched targets)
    with their hosts and previous versions loaded, and makes no query of its own."""
    if not deployment.canary_state:
        return None
    hosts = []
    for target in deployment.targets.all() if targets is None else targets:
        route = reported_route(target)
        ours = route.get("canary") == deployment.version.version
        hosts.append({"host": target.host.name, "state": target.state,
                      "stable": target.previous_version.version if target.previous_version else None,
                      "applied_percent": route.get("percent") if ours else None,
                      "applied_shadow_percent": route.get("shadow_percent") if ours else None})
    return {"percent": deployment.canary_percent, "shadow_percent": deployment.shadow_percent,
            "state": deployment.canary_state, "version": deployment.version.version, "hosts": hosts}


def resend_routes(*, now=None, backoff: float = 30.0) -> list[tuple[str, str]]:
    """Send again the route of each active canary to every host it reached whose gateway last reported
    another route for the model (a percent changed while the host was still loading, a lost task, a
    restarted gateway), or other capture settings when it can capture (``routes.capture_differs``).
    At most once per ``backoff`` seconds per (host, model), shared through the
    broker's Redis.

    Returns:
        The (host, model) pairs a route was sent to.
    """
    sent = []
    canaries = (Deployment.objects.filter(canary_state=CanaryState.ACTIVE)
                .exclude(status__in=[DeploymentStatus.CANCELLED, DeploymentStatus.ROLLED_BACK])
                .select_related("version", "model"))
    for canary in canaries:
        for target in _reached(canary):
            if not target.host.is_online(now=now):
                continue
            want = route_payload(target, canary.canary_percent or 0, canary.shadow_percent)
            have = reported_route(target)
            if all(have.get(key) == want[key] for key in ("stable", "canary", "percent", "shadow", "shadow_percent")) \
                    and (why_no_capture(target.host) or not capture_differs(target)):
                continue
            key = f"modelyard:route-repair:{target.host.name}:{target.runtime_name}"
            if not broker().set(key, "1", nx=True, ex=max(1, int(backoff))):
                continue
            send_to_host(target.host.name, AgentTask.ROUTE, want)
            sent.append((target.host.name, target.runtime_name))
    return sent
