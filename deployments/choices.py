"""Enumerations and the state machine table of the deployments app."""

from django.db import models

from modelyard.states import StateMachine
from modelyard_agent import contract
from registry.choices import ArtifactFormat


class Runtime(models.TextChoices):
    """The serving runtime a host runs (the values are ``modelyard_agent.contract.Runtime``'s)."""

    TRITON = contract.Runtime.TRITON.value, "NVIDIA Triton Inference Server"
    BENTOML = contract.Runtime.BENTOML.value, "BentoML (bentoml serve behind nginx)"


# Which registry artifact formats each runtime can serve.
RUNTIME_FORMATS: dict[str, frozenset[str]] = {
    Runtime.TRITON: ArtifactFormat.triton_formats(),
    Runtime.BENTOML: ArtifactFormat.bentoml_formats(),
}


class TargetState(models.TextChoices):
    """Where one host stands in carrying out a deployment: the steps of a swap, in order (the values
    are ``modelyard_agent.contract.TargetState``'s, which agents report)."""

    PENDING = contract.TargetState.PENDING.value, "Pending"
    STAGING = contract.TargetState.STAGING.value, "Staging"
    LOADING = contract.TargetState.LOADING.value, "Loading beside the old version"
    VERIFYING = contract.TargetState.VERIFYING.value, "Smoke inference"
    CUTTING_OVER = contract.TargetState.CUTTING_OVER.value, "Cutting over, old version draining"
    READY = contract.TargetState.READY.value, "Ready"
    FAILED = contract.TargetState.FAILED.value, "Failed"
    CANCELLED = contract.TargetState.CANCELLED.value, "Cancelled"
    UNLOADED = contract.TargetState.UNLOADED.value, "Unloaded (by hand or for idleness)"


class JobStatus(models.TextChoices):
    """Where an agent job (a profile, a replay: ``deployments.agent_jobs``) stands; the values are
    ``modelyard_agent.contract.JobStatus``'s."""

    QUEUED = contract.JobStatus.QUEUED.value, "Queued for the host's agent"
    RUNNING = contract.JobStatus.RUNNING.value, "Running"
    SUCCEEDED = contract.JobStatus.SUCCEEDED.value, "Done"
    FAILED = contract.JobStatus.FAILED.value, "Failed"
    CANCELLED = contract.JobStatus.CANCELLED.value, "Cancelled"


ACTIVE_JOB_STATES = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})
# A report may arrive after the orchestrator ended a job (a cancel of a queued one, a stalled one
# failed by the reconciler): only these moves are taken, the rest are ignored.
JOB_MACHINE = StateMachine(name="agent job", field="status", moves={
    JobStatus.QUEUED: frozenset({JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.RUNNING: frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}),
})


STEP_ORDER = (TargetState.PENDING, TargetState.STAGING, TargetState.LOADING, TargetState.VERIFYING,
              TargetState.CUTTING_OVER)
ACTIVE_TARGET_STATES = frozenset(STEP_ORDER)
TERMINAL_TARGET_STATES = frozenset(
    {TargetState.READY, TargetState.FAILED, TargetState.CANCELLED, TargetState.UNLOADED}
)

# Allowed moves. Progress reports from a host agent may arrive out of order
# (they travel as separate tasks), so a step may be skipped forward but never
# re-entered; a stale report is refused by ``transition`` and ignored by callers.
# Only a target no agent has started can be cancelled.
TARGET_TRANSITIONS: dict[str, frozenset[str]] = {
    **{
        step: frozenset(STEP_ORDER[i + 1:]) | {TargetState.READY, TargetState.FAILED}
        for i, step in enumerate(STEP_ORDER)
    },
    # A served version leaves its host only by an explicit unload; a reload is a new rollout.
    TargetState.READY: frozenset({TargetState.UNLOADED}),
    TargetState.FAILED: frozenset(),
    TargetState.CANCELLED: frozenset(),
    TargetState.UNLOADED: frozenset(),
}
TARGET_TRANSITIONS[TargetState.PENDING] = TARGET_TRANSITIONS[TargetState.PENDING] | {TargetState.CANCELLED}
TARGET_MACHINE = StateMachine("deployment target", "state", TARGET_TRANSITIONS)


class DeploymentStatus(models.TextChoices):
    """Where a deployment's rollout stands.

    RUNNING: batches are being moved; PAUSED: stopped by an operator or by a failed host under the
    ``pause`` policy, waiting for resume, cancel or rollback; SUCCEEDED: every host serves the
    version; FAILED: finished with at least one host that could not load it (those hosts kept
    their old version); CANCELLED: stopped for good, hosts not yet moved were left alone;
    ROLLED_BACK: the hosts it had moved were sent back to their previous version.
    """

    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"
    ROLLED_BACK = "rolled_back", "Rolled back"


ACTIVE_DEPLOYMENT_STATUSES = frozenset({DeploymentStatus.RUNNING, DeploymentStatus.PAUSED})
TERMINAL_DEPLOYMENT_STATUSES = frozenset(
    {DeploymentStatus.SUCCEEDED, DeploymentStatus.FAILED, DeploymentStatus.CANCELLED, DeploymentStatus.ROLLED_BACK}
)

DEPLOYMENT_TRANSITIONS: dict[str, frozenset[str]] = {
    DeploymentStatus.RUNNING: frozenset(
        {DeploymentStatus.PAUSED, DeploymentStatus.SUCCEEDED, DeploymentStatus.FAILED, DeploymentStatus.CANCELLED,
         DeploymentStatus.ROLLED_BACK}
    ),
    DeploymentStatus.PAUSED: frozenset(
        {DeploymentStatus.RUNNING, DeploymentStatus.CANCELLED, DeploymentStatus.ROLLED_BACK}
    ),
    # A finished rollout can still be rolled back (its hosts return to what they served before).
    DeploymentStatus.SUCCEEDED: frozenset({DeploymentStatus.ROLLED_BACK}),
    DeploymentStatus.FAILED: frozenset({DeploymentStatus.ROLLED_BACK}),
    DeploymentStatus.CANCELLED: frozenset({DeploymentStatus.ROLLED_BACK}),
    DeploymentStatus.ROLLED_BACK: frozenset(),
}
DEPLOYMENT_MACHINE = StateMachine("deployment", "status", DEPLOYMENT_TRANSITIONS)


class FailurePolicy(models.TextChoices):
    """What a rollout does when a host fails to load the new version (that host keeps its old one)."""

    PAUSE = "pause", "Pause and wait for an operator"
    ROLLBACK = "rollback", "Roll back the hosts already moved"


class RolloutTrigger(models.TextChoices):
    """What started a rollout."""

    OPERATOR = "operator", "An operator or CI"
    ALIAS = "alias", "Its alias moved"
    ROLLBACK = "rollback", "A rollback"
    PREREQUISITE = "prerequisite", "An ensemble that composes it"
    RECONCILER = "reconciler", "The reconciler"
    RELOAD = "reload", "A reload after an unload"
    AUTOSCALE = "autoscale", "The autoscaler"


class Residency(models.TextChoices):
    """Whether a deployment's model stays loaded on its hosts. ``always``: loaded while it serves (a host's
    memory must hold it); ``on_demand``: registered on each host but loaded at its first request and evicted
    when the host's memory budget needs room (Triton hosts with a gateway; ``modelyard_agent.residency``)."""

    ALWAYS = "always", "Always resident"
    ON_DEMAND = "on_demand", "On demand"


class CanaryState(models.TextChoices):
    """Where a canary (or shadow) deployment stands (blank for a deployment without one). ``active``: each
    host keeps the version it served (stable) beside the new one, and its gateway sends the
    deployment's ``canary_percent`` of the requests that name no version to the new one and mirrors
    ``shadow_percent`` of them to it; ``promoted``
    and ``rolled_back``: a later rollout made the new, or the stable, version the only one."""

    ACTIVE = "active", "Active"
    PROMOTED = "promoted", "Promoted"
    ROLLED_BACK = "rolled_back", "Rolled back"
