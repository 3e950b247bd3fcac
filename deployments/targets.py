"""Deployment targets on the wire: every state change of a target (``transition``, and the agent's reports
through ``record_target_progress``), and the payload that tells a host agent how to carry one out.
"""

import logging

from django.db import transaction
from django.utils import timezone

from deployments.choices import TARGET_MACHINE, CanaryState, TargetState
from deployments.models import DeploymentTarget, TargetEvent
from modelyard.errors import NotFound
from modelyard.states import IllegalTransition
from modelyard_agent.claims import claim_key
from registry.formats import archive_limits
from registry.models import ModelVersion

logger = logging.getLogger(__name__)


def transition(target_id: int, to_state: str, *, message: str = "", details: dict | None = None) -> bool:
    """Move a deployment target to ``to_state`` with a compare-and-set update.

    Args:
        target_id: the DeploymentTarget's primary key.
        to_state: a ``TargetState`` value.
        message: the error (for FAILED) or a note, kept on the event row.
        details: merged into the target's ``details``.

    Returns:
        True when the state changed, False when the target was already in
        ``to_state`` (a repeat is a no-op).

    Raises:
        IllegalTransition: the move is not in ``TARGET_TRANSITIONS`` (for
            example a late progress report for a finished target); a ``Conflict``.
        NotFound: no such target.
    """
    with transaction.atomic():
        try:
            target = DeploymentTarget.objects.select_for_update().get(pk=target_id)
        except DeploymentTarget.DoesNotExist as exc:
            raise NotFound(f"no deployment target {target_id}") from exc
        before = target.state
        changed = TARGET_MACHINE.move(
            target, to_state, refusal=f"target {target_id}: {before} -> {to_state} is not allowed",
            error=message if to_state == TargetState.FAILED else target.error,
            details={**target.details, **(details or {})}, updated_at=timezone.now(),
        )
        if changed:
            TargetEvent.objects.create(target=target, from_state=before, to_state=to_state, message=message)
        return changed


def record_target_progress(target_id: int, state: str, *, message: str = "", details: dict | None = None) -> None:
    """Record a host agent's report for a target; stale or repeated reports are ignored.

    Args:
        target_id: the DeploymentTarget's primary key.
        state: the ``TargetState`` the agent reached.
        message: Triton's or the agent's error text for FAILED.
        details: what the agent measured (durations in seconds, replaced versions).
    """
    try:
        transition(target_id, state, message=message, details=details)
    except IllegalTransition as exc:
        logger.info("ignoring stale progress report: %s", exc)


def build_agent_payload(target: DeploymentTarget, *, download_url: str) -> dict:
    """Return the JSON payload a host agent needs to carry out one target.

    The agent gets no database or S3 credentials: it receives a presigned
    download URL, the artifact's sha256 and size (bytes), the uploaded
    config.pbtxt text (bento.yaml or model.yaml for BentoML archives) and the host's config
    overrides. ``runtime`` tells the agent which runtime adapter carries the target out;
    ``load_deadline`` and ``unload_deadline`` (seconds) bound each load and unload there;
    ``claim`` names the key the agent and a cancel race for (``modelyard_agent.claims``);
    ``archive_limits`` are the registry's own, which the agent checks again before it unpacks.
    The shape is ``modelyard_agent.contract.DeployPayload``; ``deployments.enqueue.send_to_host``
    stamps the protocol on it.
    """

    version: ModelVersion = target.deployment.version
    return {
        "target_id": target.pk,
        "claim": claim_key(target.pk, target.dispatched_at) if target.dispatched_at else str(target.pk),
        "host": target.host.name,
        "runtime": target.host.runtime,
        "format": version.format,
        "model": target.runtime_name,
        "version": version.version,
        "artifact_url": download_url,
        "sha256": version.artifact_sha256,
        "size": version.artifact_size,
        "config_text": version.config_text,
        "parameters": dict(target.host.config_overrides.get("parameters", {})),
        "config_overrides": dict(target.deployment.config_overrides),
        "sample_input": (version.metadata or {}).get("sample_input"),
        "signature": version.signature,
        "inference_url": target.host.inference_url,
        "metrics_url": target.host.metrics_url,
        "load_deadline": target.host.load_deadline_seconds,
        "unload_deadline": target.host.unload_deadline_seconds,
        "archive_limits": archive_limits().as_payload(),
        "canary_percent": (target.deployment.canary_percent
                           if target.deployment.canary_state == CanaryState.ACTIVE else None),
        "shadow_percent": (target.deployment.shadow_percent
                           if target.deployment.canary_state == CanaryState.ACTIVE else None),
        "max_request_bytes": target.deployment.max_request_bytes,
        **target.deployment.residency_settings(),
    }
