"""Enumerations of the promotions app."""

from django.db import models


class Decision(models.TextChoices):
    """What one evaluation of a promotion policy decided.

    PENDING: queued, not evaluated yet. PROMOTED: every gate passed and the target alias moved.
    HELD: a gate failed; nothing changed. AWAITING_APPROVAL: every gate passed and the policy wants
    a person to approve; APPROVED (the alias moved) or REJECTED follows. DRY_RUN_PASS: every gate
    passed in dry-run mode; nothing changed. SKIPPED: nothing to promote (the target alias already
    names the candidate's version). ERROR: the evaluation could not be made (Prometheus down, the
    candidate alias missing); nothing changed. ADVANCED: every gate passed and a progressive rollout's
    canary moved to its next step of traffic (``promotions.ramps``). ROLLED_BACK: a gate failed and the
    ramp's canary was rolled back.
    """

    PENDING = "pending", "Pending"
    PROMOTED = "promoted", "Promoted"
    HELD = "held", "Held"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    APPROVED = "approved", "Approved and promoted"
    REJECTED = "rejected", "Rejected"
    DRY_RUN_PASS = "dry_run_pass", "Would promote (dry run)"
    SKIPPED = "skipped", "Nothing to promote"
    ERROR = "error", "Error"
    ADVANCED = "advanced", "Canary advanced a step"
    ROLLED_BACK = "rolled_back", "Canary rolled back"


# Decisions after which nothing more happens to an evaluation (CI stops polling).
FINAL_DECISIONS = frozenset({
    Decision.PROMOTED, Decision.HELD, Decision.APPROVED, Decision.REJECTED, Decision.DRY_RUN_PASS,
    Decision.SKIPPED, Decision.ERROR, Decision.ADVANCED, Decision.ROLLED_BACK,
})
# Decisions under which the target alias moved.
PROMOTING_DECISIONS = frozenset({Decision.PROMOTED, Decision.APPROVED})


class EvaluationTrigger(models.TextChoices):
    """What asked for an evaluation."""

    SCHEDULE = "schedule", "The policy's schedule"
    MANUAL = "manual", "Run now (a person or CI)"


class WebhookEvent(models.TextChoices):
    """Events a webhook may subscribe to."""

    PROMOTION = "promotion", "A promotion moved an alias"
    ROLLOUT_SUCCEEDED = "rollout.succeeded", "A rollout succeeded"
    ROLLOUT_FAILED = "rollout.failed", "A rollout failed or was rolled back before finishing"
    VERSION_REGISTERED = "version.registered", "A version was registered"
    VERSION_DELETED = "version.deleted", "A version was deleted"
    ALIAS_MOVED = "alias.moved", "An alias was set or moved"
    MODEL_TAGS_CHANGED = "model.tags_changed", "A model's tags changed"
    VERSION_CORRUPT = "version.corrupt", "A version's stored bytes do not match its sha256"


class DeliveryStatus(models.TextChoices):
    """Where one webhook delivery stands: PENDING while attempts remain, then DELIVERED or FAILED."""

    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"
