"""Unload a model from a host and load it again, by hand or when it served nothing for a while.

Unloading marks every READY target of the (host, model) UNLOADED in the same transaction that
enqueues the agent's unload, so the reconciler no longer counts it as desired state and does not
load it back; the agent unloads under the per-(host, model) lock. Reloading is a one-host
rollout of the version that was unloaded, with the same config overrides.

The idle policy asks Prometheus how many requests each served (host, model) answered over
``settings.IDLE_UNLOAD_AFTER`` seconds and unloads those that answered none. A model whose series
Prometheus does not have (never scraped) is left alone: no data is not the same as no traffic.
"""

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.choices import AuditAction
from audit.services import record_audit_event
from deployments.choices import ACTIVE_TARGET_STATES, Residency, RolloutTrigger, TargetState
from deployments.enqueue import send_to_host
from deployments.hosts import get_host
from deployments.models import Deployment, DeploymentTarget
from deployments.served import serving_now
from deployments.services import create_rollout
from deployments.targets import transition
from modelyard.celery import require_broker
from modelyard.errors import Conflict, NotFound
from modelyard_agent.contract import AgentTask
from monitoring.readings import requests_per_host_model
from registry.models import RegisteredModel
from registry.registered_models import get_model

logger = logging.getLogger(__name__)


def serving_target(host_name: str, model_name: str) -> DeploymentTarget:
    """The READY target through which ``host_name`` serves ``model_name`` now (newest wins).

    Raises:
        NotFound: unknown host or model, or the host serves no version of it.
    """
    host, model = get_host(host_name), get_model(model_name)
    serving = serving_now(host=host, deployment__model=model)
    if not serving:
        raise NotFound(f"{host.name} serves no version of {model.name}")
    return serving[0]


def unload_payload(host, model_name: str) -> dict:
    """What the host agent's ``unload_model_on_host`` task needs: the host's endpoints and deadline."""
    return {"host": host.name, "model": model_name, "inference_url": host.inference_url,
            "metrics_url": host.metrics_url, "runtime": host.runtime, "unload_deadline": host.unload_deadline_seconds}


def request_unload(host, model_name: str, *, reason: str) -> bool:
    """Have ``host`` unload ``model_name`` (the runtime's name for it), which no deployment wants served
    there (the reconciler, for a model its runtime holds LOADING or UNLOADING); audited with the
    reconciler as actor, on the registry model that name belongs to on that host.

    Returns:
        False when the model is not registered (nothing of the registry's to unload), else True.
    """

    holder = (DeploymentTarget.objects.filter(host=host, served_name=model_name)
              .select_related("deployment__model").order_by("-id").first())
    model = holder.deployment.model if holder else RegisteredModel.objects.filter(name=model_name).first()
    if model is None:
        return False
    with transaction.atomic():
        record_audit_event(action=AuditAction.MODEL_UNLOADED, actor=None, obj_type="host", obj_id=host.pk,
                           model=model, data={"host": host.name, "reason": reason, "by": "reconciler",
                                              "served_as": model_name})
        payload = unload_payload(host, model_name)
        transaction.on_commit(lambda: send_to_host(host.name, AgentTask.UNLOAD, payload))
    return True


def unload_model(*, host_name: str, model_name: str, actor=None, reason: str = "unloaded by an operator") -> int:
    """Stop serving ``model_name`` on ``host_name``; the host's agent unloads it from its runtime.

    Returns:
        The version number that was unloaded.

    Raises:
        NotFound: the host serves no version of the model.
        Conflict: a rollout of the model is in progress on that host.
        ServiceUnavailable: the task queue does not answer; nothing changed.
    """

    target = serving_target(host_name, model_name)
    host, model, version = target.host, target.deployment.model, target.deployment.version
    require_broker("the unload")
    with transaction.atomic():
        busy = DeploymentTarget.objects.select_for_update().filter(
            host=host, deployment__model=model, state__in=ACTIVE_TARGET_STATES)
        if busy.exists():
            raise Conflict(f"a rollout of {model.name} is in progress on {host.name}; wait for it or cancel it")
        ready = DeploymentTarget.objects.filter(host=host, deployment__model=model, state=TargetState.READY)
        for pk in ready.values_list("pk", flat=True):  # the one serving, and any older ones still READY
            transition(pk, TargetState.UNLOADED, message=reason)
        record_audit_event(action=AuditAction.MODEL_UNLOADED, actor=actor, obj_type="host", obj_id=host.pk,
                           model=model, data={"host": host.name, "version": version.version, "reason": reason})
        # The name the runtime knows it by: a model renamed since it was loaded keeps its old one there.
        payload = unload_payload(host, target.runtime_name)
        transaction.on_commit(lambda: send_to_host(host.name, AgentTask.UNLOAD, payload))
    logger.info("unloading %s v%s from %s: %s", model.name, version.version, host.name, reason)
    return version.version


def reload_model(*, host_name: str, model_name: str, actor=None) -> Deployment:
    """Load again the version last unloaded from ``host_name``, as a one-host rollout.

    Returns:
        The new deployment.

    Raises:
        NotFound: nothing of the model was unloaded from that host.
        Conflict: the host serves the model already.
    """
    host, model = get_host(host_name), get_model(model_name)
    if serving_now(host=host, deployment__model=model):
        raise Conflict(f"{host.name} serves {model.name} already")
    unloaded = (DeploymentTarget.objects.filter(host=host, deployment__model=model, state=TargetState.UNLOADED)
                .select_related("deployment__version").order_by("deployment__created_at", "deployment_id").last())
    if unloaded is None:
        raise NotFound(f"no version of {model.name} was unloaded from {host.name}")
    with transaction.atomic():
        deployment = create_rollout(model_version=unloaded.deployment.version, hosts=[host],
                                    config_overrides=unloaded.deployment.config_overrides,
                                    autoscale=unloaded.deployment.autoscale,
                                    max_request_bytes=unloaded.deployment.max_request_bytes,
                                    **unloaded.deployment.residency_settings(),
                                    trigger=RolloutTrigger.RELOAD, actor=actor)
        record_audit_event(action=AuditAction.MODEL_RELOADED, actor=actor, obj_type="host", obj_id=host.pk,
                           model=model, data={"host": host.name, "version": unloaded.deployment.version.version,
                                              "deployment": deployment.pk})
    return deployment


def unload_idle_models(*, now=None, client=None) -> list[tuple[str, str]]:
    """Unload every served (host, model) that answered no request for ``settings.IDLE_UNLOAD_AFTER`` s.

    Does nothing when the setting is 0. Only models served for longer than the window qualify, and none
    deployed on demand (their hosts evict them by memory, and a request loads them again).

    Returns:
        The (host, model) pairs unloaded.

    Raises:
        ServiceUnavailable: Prometheus could not be asked (nothing is unloaded then).
    """

    window = settings.IDLE_UNLOAD_AFTER
    if not window:
        return []
    now = now or timezone.now()
    # Prometheus labels series with the runtime's name for the model (kept across renames).
    served = {(target.host.name, target.runtime_name): target for target in serving_now()}
    if not served:
        return []
    counts = requests_per_host_model(window_seconds=int(window), client=client)
    unloaded = []
    for (host, served_as), target in sorted(served.items()):
        if target.updated_at > now - timedelta(seconds=window):
            continue  # loaded within the window: too new to judge
        if target.deployment.residency == Residency.ON_DEMAND:
            continue  # the host's agent evicts it when it needs room; unloading here would unregister it
        if counts.get((host, served_as)) == 0:
            model = target.deployment.model.name
            unload_model(host_name=host, model_name=model, reason=f"served no request for {window:g} s")
            unloaded.append((host, model))
    return unloaded


def describe_host_operation(host) -> str:
    """How a refusal names unloading or reloading a model on ``host`` (a ServingHost)."""
    where = f"production host {host.name}" if host.production else host.name
    return f"unloading or reloading a model on {where}"
