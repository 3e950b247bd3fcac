"""Serializers of the promotions API."""

from rest_framework import serializers

from accounts.models import Team
from modelyard.api import RefuseUnknownFields
from promotions.choices import Decision, DeliveryStatus, WebhookEvent
from promotions.evaluations import is_final
from promotions.models import PromotionEvaluation, PromotionPolicy, Webhook, WebhookDelivery
from registry.models import RegisteredModel

POLICY_FIELDS = ["name", "candidate_alias", "target_alias", "schedule", "window_seconds", "min_requests",
                 "max_p95_ms", "max_error_rate", "max_regression", "max_profile_regression", "min_agreement",
                 "max_latency_regression", "replay_atol", "replay_rtol", "replay_argmax_outputs", "replay_max_requests",
                 "replay_pace", "ramp_steps",
                 "ramp_on_failure", "requires_approval", "dry_run", "enabled"]


class PromotionPolicySerializer(serializers.ModelSerializer):
    """A promotion policy as the API shows it."""

    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = PromotionPolicy
        fields = ["id", "model", *POLICY_FIELDS, "created_by", "created_at", "updated_at"]
        read_only_fields = fields


class PromotionPolicyWriteSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST`` (all but the gates required) and ``PATCH`` (any subset) on promotion policies.

    The service checks the values (alias grammar, crontab, bounds) and answers 400 naming the field.
    """

    model = serializers.CharField(max_length=200, help_text="create only")
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    candidate_alias = serializers.CharField(max_length=63, help_text="the alias whose version is judged")
    target_alias = serializers.CharField(max_length=63, help_text="the alias moved when every gate passes")
    schedule = serializers.CharField(max_length=100, required=False, default="*/15 * * * *",
                                     help_text="five-field crontab, UTC")
    window_seconds = serializers.IntegerField(required=False, default=900, help_text="seconds, 60 to 604800")
    min_requests = serializers.IntegerField(required=False, allow_null=True, default=100)
    max_p95_ms = serializers.FloatField(required=False, allow_null=True, default=None, help_text="milliseconds")
    max_error_rate = serializers.FloatField(required=False, allow_null=True, default=None, help_text="0..1")
    max_regression = serializers.FloatField(required=False, allow_null=True, default=None,
                                            help_text="relative to the target version, 0.1 = 10 % worse")
    max_profile_regression = serializers.FloatField(
        required=False, allow_null=True, default=None,
        help_text="measured throughput at most this much lower than the target version's (0.1 = 10 %), by their "
                  "performance cards on the same host, at the config and concurrency the target's card recommends")
    min_agreement = serializers.FloatField(
        required=False, allow_null=True, default=None,
        help_text="0..1: the share of captured requests, replayed against the target version, on which the "
                  "candidate's answers must agree (an evaluation without a recent replay starts one and holds)")
    max_latency_regression = serializers.FloatField(
        required=False, allow_null=True, default=None,
        help_text="the candidate's replayed p95 at most this much above the target version's (0.2 = 20 %)")
    replay_atol = serializers.FloatField(required=False, default=1e-5, help_text="absolute tolerance of float outputs")
    replay_rtol = serializers.FloatField(required=False, default=1e-3, help_text=(
        "relative tolerance of float outputs: |candidate - target| <= atol + rtol * |target| (numpy.isclose)"))
    replay_argmax_outputs = serializers.ListField(
        child=serializers.CharField(max_length=200), required=False, default=list, max_length=64,
        help_text="outputs compared by argmax over their last axis (score vectors)")
    replay_max_requests = serializers.IntegerField(required=False, default=1000,
                                                   help_text="captured requests a replay sends, 1..100000")
    replay_pace = serializers.FloatField(required=False, default=20.0, help_text=(
        "captured requests per second the replays the policy starts send to each version, 1..1000"))
    ramp_steps = serializers.ListField(
        child=serializers.FloatField(), required=False, default=list, max_length=20,
        help_text="a progressive rollout: the percents of traffic the candidate's canary goes through, ending at "
                  "100, e.g. [5, 25, 50, 100]; each passing evaluation takes the next step")
    ramp_on_failure = serializers.ChoiceField(choices=["hold", "rollback"], required=False, default="hold",
                                              help_text="what a failed gate does to a ramp's canary")
    requires_approval = serializers.BooleanField(required=False, default=False)
    dry_run = serializers.BooleanField(required=False, default=False)
    enabled = serializers.BooleanField(required=False, default=True)


class GateCheckSerializer(serializers.Serializer):
    """One gate's verdict within an evaluation."""

    gate = serializers.CharField()
    passed = serializers.BooleanField()
    value = serializers.FloatField(allow_null=True)
    limit = serializers.FloatField(allow_null=True)
    message = serializers.CharField()


class PromotionEvaluationSerializer(serializers.ModelSerializer):
    """One evaluation: the versions, the metrics seen, each gate's verdict, the decision and the reason.

    ``final`` is true once nothing more will happen (CI stops polling); ``awaiting_approval`` is
    not final.
    """

    model = serializers.CharField(source="policy.model.name", read_only=True)
    candidate_version = serializers.IntegerField(source="candidate_version.version", read_only=True, allow_null=True)
    target_version = serializers.IntegerField(source="target_version.version", read_only=True, allow_null=True)
    decision = serializers.ChoiceField(choices=Decision.choices, read_only=True)
    checks = GateCheckSerializer(many=True, read_only=True)
    final = serializers.SerializerMethodField()
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    decided_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = PromotionEvaluation
        fields = ["id", "policy", "model", "trigger", "candidate_version", "target_version", "metrics", "checks",
                  "decision", "final", "reason", "requested_by", "decided_by", "created_at", "decided_at"]
        read_only_fields = fields

    def get_final(self, evaluation: PromotionEvaluation) -> bool:
        return is_final(evaluation)


class RejectSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST .../reject/``: an optional reason."""

    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")


class WebhookSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    """A webhook. ``secret`` is write-only (a random one is made when omitted) and shown once, in the
    answer to ``POST``."""

    url = serializers.CharField(max_length=500)
    secret = serializers.CharField(max_length=128, write_only=True, required=False, allow_blank=True, default="",
                                   help_text="HMAC-SHA256 key, 16+ characters")
    events = serializers.ListField(child=serializers.ChoiceField(choices=WebhookEvent.choices), required=False,
                                   help_text="default: every event")
    model = serializers.SlugRelatedField(slug_field="name", queryset=RegisteredModel.objects.all(), required=False,
                                         allow_null=True, default=None,
                                         help_text="only this model's events; empty: all models")
    team = serializers.SlugRelatedField(slug_field="name", queryset=Team.objects.all(), required=False,
                                        allow_null=True, default=None,
                                        help_text="only this team's events, managed by its owners; empty: every "
                                                  "team's (administrators only)")

    class Meta:
        model = Webhook
        fields = ["id", "url", "secret", "events", "model", "team", "enabled", "created_at"]
        read_only_fields = ["id", "created_at"]


class WebhookCreatedSerializer(WebhookSerializer):
    """The answer to creating a webhook: the webhook with its secret, shown this once."""

    secret = serializers.CharField(read_only=True)


class WebhookDeliverySerializer(serializers.ModelSerializer):
    """One delivery of an event to a webhook: attempts, outcome and the last error."""

    status = serializers.ChoiceField(choices=DeliveryStatus.choices, read_only=True)

    class Meta:
        model = WebhookDelivery
        fields = ["id", "webhook", "event", "payload", "status", "attempts", "response_status", "last_error",
                  "created_at", "delivered_at"]
        read_only_fields = fields
