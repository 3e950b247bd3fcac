"""The autoscaler: more Triton model instances on a host while requests queue, fewer once they stop.

For every (host, model) served through a deployment with ``autoscale`` bounds, the mean queue time
over ``settings.AUTOSCALE_WINDOW`` seconds (from Prometheus: ``nv_inference_queue_duration_us`` per
successful request) is compared with the bounds: above ``queue_ms_high`` one instance is added, up
to ``max_instances``; below ``queue_ms_low`` one is removed, down to ``min_instances``. The change is
a one-host rollout of the same version with the instance count in its config overrides, so it
goes through the same agent steps, lock and history as any rollout (trigger ``autoscale``). A host
changed less than one window ago is left alone, so each decision sees a full window of the new
count; a model Prometheus has no queue series for (BentoML, or not scraped) is left alone.
"""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from deployments.choices import ACTIVE_TARGET_STATES, RolloutTrigger
from deployments.models import DeploymentTarget
from deployments.served import serving_now
from deployments.services import create_rollout
from modelyard_agent.formats.triton_config import instance_groups_of
from monitoring.readings import queue_ms_per_host_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScaleDecision:
    """One change the autoscaler made: instances per host before and after, and the queue time (ms) seen."""

    host: str
    model: str
    version: int
    instances_before: int
    instances_after: int
    queue_ms: float
    deployment_id: int


def instance_groups(target: DeploymentTarget) -> list[dict]:
    """The instance groups a target's version runs with: the deployment's override, else the version's config.

    Returns:
        protobuf-JSON instance groups (``[{"count": n, "kind": ...}]``); ``[{"count": 1}]`` when
        neither names any (Triton's default is one instance per GPU or one on the CPU).
    """
    groups = (target.deployment.config_overrides or {}).get("instance_group")
    if groups:
        return [dict(g) for g in groups]
    return instance_groups_of(target.deployment.version.config_text or "")


def decide(instances: int, queue_ms: float, bounds: dict) -> int:
    """The instance count for a queue time: one more above the high mark, one fewer below the low mark.

    Args:
        instances: the count now (per host, first instance group).
        queue_ms: mean queue time in milliseconds over the window.
        bounds: ``{"min_instances", "max_instances", "queue_ms_high", "queue_ms_low"}``.

    Returns:
        The new count, within the bounds (equal to ``instances`` when nothing should change).
    """
    if queue_ms > bounds["queue_ms_high"] and instances < bounds["max_instances"]:
        return instances + 1
    if queue_ms < bounds["queue_ms_low"] and instances > bounds["min_instances"]:
        return instances - 1
    return max(min(instances, bounds["max_instances"]), bounds["min_instances"])


def autoscale_fleet(*, now=None, client=None) -> list[ScaleDecision]:
    """Apply ``decide`` to every served (host, model) whose deployment has autoscale bounds.

    Returns:
        The changes started (one-host rollouts).

    Raises:
        ServiceUnavailable: Prometheus could not be asked (nothing changes then).
    """

    now = now or timezone.now()
    window = int(settings.AUTOSCALE_WINDOW)
    scaled = {(t.host.name, t.deployment.model.name): t for t in serving_now() if t.deployment.autoscale}
    if not scaled:
        return []
    queue = queue_ms_per_host_model(window_seconds=window, client=client)
    decisions = []
    for (host, model), target in sorted(scaled.items()):
        queue_ms = queue.get((host, model))
        if queue_ms is None or target.updated_at > now - timedelta(seconds=window):
            continue
        groups = instance_groups(target)
        before = int(groups[0].get("count", 1))
        after = decide(before, queue_ms, target.deployment.autoscale)
        if after == before:
            continue
        if DeploymentTarget.objects.filter(host=target.host, deployment__model=target.deployment.model,
                                           state__in=ACTIVE_TARGET_STATES).exists():
            continue  # a rollout is already changing this model here
        groups[0]["count"] = after
        deployment = create_rollout(
            model_version=target.deployment.version, hosts=[target.host],
            config_overrides={**target.deployment.config_overrides, "instance_group": groups},
            autoscale=target.deployment.autoscale,
            max_request_bytes=target.deployment.max_request_bytes,
            **target.deployment.residency_settings(), trigger=RolloutTrigger.AUTOSCALE,
        )
        logger.info("autoscale %s on %s: %s -> %s instances (queue %.1f ms)", model, host, before, after, queue_ms)
        decisions.append(ScaleDecision(host, model, target.deployment.version.version, before, after, queue_ms,
                                       deployment.pk))
    return decisions
