"""Enumerations and the state machine table of the deployments app."""

from django.db import models


class Runtime(models.TextChoices):
    """The serving runtime a host runs."""

    TRITON = "triton", "NVIDIA Triton Inference Server"


class TargetState(models.TextChoices):
    """Where one host stands in carrying out a deployment."""

    PENDING = "pending", "Pending"
    STAGING = "staging", "Staging"
    LOADING = "loading", "Loading"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


ACTIVE_TARGET_STATES = frozenset({TargetState.PENDING, TargetState.STAGING, TargetState.LOADING})
TERMINAL_TARGET_STATES = frozenset({TargetState.READY, TargetState.FAILED})

# Allowed moves. Progress reports from a host agent may arrive out of order
# (they travel as separate tasks), so a state may be skipped forward but never
# re-entered; a stale report is refused by ``transition`` and ignored by callers.
TARGET_TRANSITIONS: dict[str, frozenset[str]] = {
    TargetState.PENDING: frozenset({TargetState.STAGING, TargetState.LOADING, TargetState.READY, TargetState.FAILED}),
    TargetState.STAGING: frozenset({TargetState.LOADING, TargetState.READY, TargetState.FAILED}),
    TargetState.LOADING: frozenset({TargetState.READY, TargetState.FAILED}),
    TargetState.READY: frozenset(),
    TargetState.FAILED: frozenset(),
}


class DeploymentStatus(models.TextChoices):
    """A deployment's overall status, derived from its targets."""

    IN_PROGRESS = "in_progress", "In progress"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"
