"""Promotion policies, their evaluations, and webhooks with their deliveries."""

from django.conf import settings
from django.db import models

from promotions.choices import Decision, DeliveryStatus, EvaluationTrigger
from registry.models import ModelVersion, RegisteredModel


class PromotionPolicy(models.Model):
    """Move ``target_alias`` to the version ``candidate_alias`` names when the candidate's metrics pass.

    Gates, read from Prometheus over the last ``window_seconds`` for the candidate's version (a gate
    left empty is not checked):

    - ``min_requests``: requests answered (successes and failures), at least;
    - ``max_p95_ms``: the worst p95 latency seen, in milliseconds, at most;
    - ``max_error_rate``: failed requests as a fraction (0..1), at most;
    - ``max_regression``: how much worse (relative, 0.1 = 10 %) than the version ``target_alias``
      names now the candidate's p95 latency and error rate may be;
    - ``max_profile_regression``: how much lower (relative, 0.1 = 10 %) the candidate's measured
      throughput may be than the target version's, by their performance cards: at the config and
      concurrency the target's card recommends, on the host that card was measured on
      (``deployments.profiles.profile_comparison``);
    - ``min_agreement``: the share (0..1) of captured requests on which the candidate's answers agree
      with the target version's, at least, by the newest replay of the candidate against the target
      version finished within the window (``deployments.replays``);
    - ``max_latency_regression``: how much slower (relative, 0.2 = 20 %) the candidate's p95 round trip
      may be than the target version's in that replay. Both gates replay with ``replay_atol``,
      ``replay_rtol`` and ``replay_argmax_outputs`` (``modelyard_agent.replay.compare``) over the newest
      ``replay_max_requests`` captured requests; without such a replay, an evaluation starts one (at
      ``replay_pace`` requests per second) and holds ("the next evaluation judges it"), and when the
      last one it started failed it says why in its reason.

    ``ramp_steps`` (percents, e.g. ``[5, 25, 50, 100]``) makes it a progressive rollout
    (``promotions.ramps``): each passing evaluation moves the candidate's active traffic canary to the
    next step, and the last one promotes it and moves the alias; ``ramp_on_failure`` (``hold`` or
    ``rollback``) says what a failed gate does to the canary.

    ``requires_approval`` stops a passing evaluation at AWAITING_APPROVAL; ``dry_run`` records what
    would happen and moves nothing. The schedule is ``periodic_task`` (django-celery-beat, with a
    crontab), kept in step with ``schedule`` and ``enabled`` by ``promotions.policies`` so that beat
    picks up edits without a restart.
    """

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="promotion_policies")
    name = models.CharField(max_length=100, blank=True, help_text="a label for people; optional")
    candidate_alias = models.CharField(max_length=63, help_text="e.g. staging, canary")
    target_alias = models.CharField(max_length=63, help_text="e.g. production")
    schedule = models.CharField(max_length=100, default="*/15 * * * *",
                                help_text="crontab: minute hour day-of-month month day-of-week (UTC)")
    window_seconds = models.PositiveIntegerField(default=900)
    min_requests = models.PositiveIntegerField(null=True, blank=True, default=100)
    max_p95_ms = models.FloatField(null=True, blank=True)
    max_error_rate = models.FloatField(null=True, blank=True)
    max_regression = models.FloatField(null=True, blank=True)
    max_profile_regression = models.FloatField(null=True, blank=True)
    min_agreement = models.FloatField(null=True, blank=True)
    max_latency_regression = models.FloatField(null=True, blank=True)
    replay_atol = models.FloatField(default=1e-5, help_text="absolute tolerance of float outputs in replays")
    replay_rtol = models.FloatField(default=1e-3, help_text="relative tolerance of float outputs in replays")
    replay_argmax_outputs = models.JSONField(default=list, blank=True, help_text=(
        "outputs a replay compares by argmax over their last axis, e.g. [\"probabilities\"]"))
    replay_max_requests = models.PositiveIntegerField(default=1000, help_text="captured requests a replay sends")
    replay_pace = models.FloatField(default=20.0, help_text=(
        "captured requests per second the replays this policy starts send to each version, 1..1000"))
    ramp_steps = models.JSONField(default=list, blank=True, help_text=(
        "percents of traffic a canary of the candidate goes through, e.g. [5, 25, 50, 100]; empty: no ramp"))
    ramp_on_failure = models.CharField(max_length=16, default="hold", choices=[
        ("hold", "Hold the canary at its step"), ("rollback", "Roll the canary back")])
    requires_approval = models.BooleanField(default=False)
    dry_run = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True, help_text="False: paused, the schedule does not run it")
    periodic_task = models.OneToOneField(
        "django_celery_beat.PeriodicTask", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model__name", "id"]
        verbose_name_plural = "promotion policies"
        constraints = [
            models.UniqueConstraint(fields=["model", "candidate_alias", "target_alias"], name="unique_promotion_path"),
        ]

    def __str__(self) -> str:
        return f"policy {self.pk}: {self.model.name} @{self.candidate_alias} -> @{self.target_alias}"

    @property
    def actor_label(self) -> str:
        """The name a promotion by this policy is recorded under in the audit log and rollout events."""
        return f"policy:{self.pk}"


class PromotionEvaluation(models.Model):
    """One evaluation of a policy: what it saw, what it decided and why.

    ``metrics``: ``{"window_seconds": s, "candidate": {"version", "requests", "latency_p95_ms",
    "error_rate"}, "target": {...} | None}``; ``checks``: one ``{"gate", "passed", "value",
    "limit", "message"}`` per gate. ``target_version`` is what ``target_alias`` named when it was
    evaluated. ``decided_by`` is the person who approved or rejected, if any.
    """

    policy = models.ForeignKey(PromotionPolicy, on_delete=models.CASCADE, related_name="evaluations")
    trigger = models.CharField(max_length=16, choices=EvaluationTrigger.choices, default=EvaluationTrigger.SCHEDULE)
    candidate_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    target_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    metrics = models.JSONField(default=dict, blank=True)
    checks = models.JSONField(default=list, blank=True)
    decision = models.CharField(max_length=20, choices=Decision.choices, default=Decision.PENDING)
    reason = models.TextField(blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["policy", "-id"], name="evaluation_policy_idx")]

    def __str__(self) -> str:
        return f"evaluation {self.pk} of policy {self.policy_id}: {self.decision}"


class Webhook(models.Model):
    """An HTTP endpoint told about registry events, promotions and rollout outcomes.

    Each delivery is a POST of a JSON body with ``X-Modelyard-Timestamp`` (unix seconds) and
    ``X-Modelyard-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" keyed with secret>``.
    ``events`` lists ``WebhookEvent`` values; ``model`` limits it to one model's events (empty: all);
    ``team`` to the events of that team's models, and lets that team's owners manage it (empty: every
    team's events, managed by administrators only).
    """

    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=128)
    events = models.JSONField(default=list)
    model = models.ForeignKey(RegisteredModel, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    team = models.ForeignKey("accounts.Team", null=True, blank=True, on_delete=models.CASCADE,
                             related_name="webhooks")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"webhook {self.pk}: {self.url}"


class WebhookDelivery(models.Model):
    """One event sent (or being sent) to one webhook, with its attempts and the last error."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=32)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    response_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"delivery {self.pk} of {self.event} to webhook {self.webhook_id}: {self.status}"
