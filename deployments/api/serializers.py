"""Serializers of the deployments API."""

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.access import Principal
from deployments.canaries import canary_summary
from deployments.choices import CanaryState, DeploymentStatus, FailurePolicy, JobStatus, Residency, Runtime
from deployments.models import (
    MAX_DEADLINE_SECONDS,
    Deployment,
    DeploymentTarget,
    Profile,
    Replay,
    RolloutEvent,
    ServingHost,
)
from deployments.profiles import overrides_for, profile_progress
from deployments.replays import may_read_captured
from deployments.served import served_owners, visible_report_rows
from modelyard.api import RefuseUnknownFields
from modelyard_agent.contract import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES


class ServingHostUpdateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``PATCH /api/v1/hosts/<name>/``: either field may be left out."""

    production = serializers.BooleanField(required=False, help_text="rollouts here need a team owner")
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    load_deadline = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_DEADLINE_SECONDS,
        help_text="seconds one load may take on this host; null: the fleet default")
    unload_deadline = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_DEADLINE_SECONDS,
        help_text="seconds one unload may take on this host; null: the fleet default")


class StuckVersionSerializer(serializers.Serializer):
    """A model version a host's runtime has held LOADING or UNLOADING past the host's deadline."""

    name = serializers.CharField()
    version = serializers.IntegerField(allow_null=True)
    state = serializers.CharField(help_text="LOADING or UNLOADING, as the runtime reports it")
    reason = serializers.CharField(help_text="the runtime's own message, empty when it gives none")
    seconds = serializers.IntegerField(help_text="seconds in that state as of the last report")
    deadline = serializers.IntegerField(help_text="the host's load or unload deadline, seconds")


class ServingHostSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    """A serving host as the API shows it and accepts it."""

    name = serializers.CharField(max_length=200, trim_whitespace=False)
    runtime = serializers.ChoiceField(choices=Runtime.choices, default=Runtime.TRITON)
    inference_url = serializers.CharField(max_length=200)
    metrics_url = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    config_overrides = serializers.JSONField(required=False, default=dict)
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False, default=dict)
    load_deadline = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_DEADLINE_SECONDS,
        help_text="seconds one load may take on this host; null: the fleet default")
    unload_deadline = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_DEADLINE_SECONDS,
        help_text="seconds one unload may take on this host; null: the fleet default")
    online = serializers.SerializerMethodField(help_text="agent reported recently and the runtime was live")
    stuck = serializers.SerializerMethodField(
        help_text="model versions the agent reports LOADING or UNLOADING for longer than the host's deadline")

    class Meta:
        model = ServingHost
        fields = ["name", "runtime", "inference_url", "metrics_url", "config_overrides", "labels", "production",
                  "load_deadline", "unload_deadline", "online", "stuck", "last_heartbeat_at", "heartbeat", "created_at"]
        read_only_fields = ["online", "stuck", "last_heartbeat_at", "heartbeat", "created_at"]
        validators = []  # uniqueness is the service's job, answered with 409

    def get_online(self, host: ServingHost) -> bool:
        return host.is_online()

    @extend_schema_field(StuckVersionSerializer(many=True))
    def get_stuck(self, host: ServingHost) -> list[dict]:
        request = self.context.get("request")
        stuck = host.stuck_versions()
        return visible_report_rows(Principal.of(request), host.pk, stuck, self._owners()) if request else stuck

    def _owners(self) -> dict:
        """``served.served_owners`` for every host, looked up once per response (a list shares it)."""
        if "_served_owners" not in self.context:
            self.context["_served_owners"] = served_owners()
        return self.context["_served_owners"]

    def to_representation(self, host: ServingHost) -> dict:
        """The host; its agent's report lists only the models the requesting principal may read."""
        data = super().to_representation(host)
        request = self.context.get("request")
        if request is not None and isinstance(data.get("heartbeat"), dict) and "models" in data["heartbeat"]:
            data["heartbeat"] = {**data["heartbeat"], "models": visible_report_rows(
                Principal.of(request), host.pk, data["heartbeat"]["models"], self._owners())}
        return data


class DeploymentTargetSerializer(serializers.ModelSerializer):
    """One host's state within a rollout: its batch, step and what it served before."""

    host = serializers.SlugRelatedField(slug_field="name", read_only=True)
    previous_version = serializers.IntegerField(source="previous_version.version", read_only=True, allow_null=True)
    residency = serializers.SerializerMethodField(help_text=(
        "on demand: the model's state on the host as its gateway last reported it (resident, cold or evicting), "
        "whether it is pinned, the requests held now, the last request (unix seconds) and the last failed load "
        "({message, retry_after}); null for a model that is always resident or a host that reported none"))

    class Meta:
        model = DeploymentTarget
        fields = ["host", "batch", "state", "error", "previous_version", "dispatched_at", "details", "residency",
                  "updated_at"]
        read_only_fields = fields

    def get_residency(self, target: DeploymentTarget) -> dict | None:

        gateway = (target.host.heartbeat or {}).get("gateway") or {}
        held = ((gateway.get("residency") or {}).get("models") or {}).get(target.runtime_name)
        if held is None:
            return None
        return {key: held.get(key) for key in ("state", "pinned", "held", "last_used", "failure")}


class RolloutEventSerializer(serializers.ModelSerializer):
    """One status change of a rollout."""

    class Meta:
        model = RolloutEvent
        fields = ["from_status", "to_status", "actor_label", "message", "created_at"]
        read_only_fields = fields


class DeploymentSerializer(serializers.ModelSerializer):
    """A deployment (rollout) with its status, settings and per-host states."""

    model = serializers.SlugRelatedField(slug_field="name", read_only=True)
    version = serializers.IntegerField(source="version.version", read_only=True)
    status = serializers.ChoiceField(choices=DeploymentStatus.choices, read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True, allow_null=True)
    targets = DeploymentTargetSerializer(many=True, read_only=True)
    events = RolloutEventSerializer(many=True, read_only=True)
    canary_state = serializers.ChoiceField(choices=CanaryState.choices, allow_blank=True, read_only=True,
                                           help_text="where a canary stands; blank for a deployment without one")
    canary = serializers.SerializerMethodField(help_text=(
        "a canary's percent and state, and per host its stable version and the percent its gateway last "
        "reported; null for a deployment that is not a canary"))

    class Meta:
        model = Deployment
        fields = ["id", "model", "version", "status", "trigger", "batch_size", "failure_policy", "follow_alias",
                  "selector", "config_overrides", "autoscale", "rollback_of", "prerequisite_for", "canary_percent",
                  "shadow_percent", "canary_state", "canary", "max_request_bytes", "residency", "pinned",
                  "cold_start_timeout", "targets", "events", "created_by",
                  "created_at", "finished_at"]
        read_only_fields = fields

    def get_canary(self, deployment: Deployment) -> dict | None:

        return canary_summary(deployment)


class _NoBooleans:
    """Refuse true/false where a percent is asked for (DRF's FloatField would take true as 1)."""

    def validate(self, attrs):
        for field in ("canary_percent", "shadow_percent"):
            if isinstance(self.initial_data.get(field), bool):
                raise serializers.ValidationError({field: ["A valid number is required."]})
        return super().validate(attrs)


class DeploymentUpdateSerializer(_NoBooleans, RefuseUnknownFields, serializers.Serializer):
    """Input of ``PATCH /api/v1/deployments/<id>/``: a canary's new shares (one or both)."""

    canary_percent = serializers.FloatField(min_value=0, max_value=100, required=False, help_text=(
        "the share of requests naming no version sent to the canary, on every host it reached"))
    shadow_percent = serializers.FloatField(min_value=0, max_value=100, required=False, help_text=(
        "the share of requests naming no version mirrored to the canary, its answers discarded"))


class DeploymentCreateSerializer(_NoBooleans, RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/deployments/``: a version or an alias to follow, hosts or a selector."""

    model = serializers.CharField(max_length=200)
    version = serializers.IntegerField(min_value=1, required=False, help_text="pin this version")
    alias = serializers.CharField(max_length=63, required=False, default="",
                                  help_text="follow this alias instead of pinning a version")
    hosts = serializers.ListField(child=serializers.CharField(max_length=200), required=False, max_length=1000)
    selector = serializers.DictField(child=serializers.CharField(max_length=200), required=False,
                                     help_text="labels the hosts must carry")
    replicas = serializers.IntegerField(min_value=1, max_value=10000, required=False,
                                        help_text="with a selector: how many hosts, chosen by free GPU memory")
    batch_size = serializers.IntegerField(min_value=1, max_value=10000, default=1,
                                          help_text="hosts moved at once (max unavailable)")
    failure_policy = serializers.ChoiceField(choices=FailurePolicy.choices, default=FailurePolicy.PAUSE)
    config_overrides = serializers.JSONField(required=False, help_text=(
        "partial Triton model config applied at load: instance_group, dynamic_batching, max_batch_size"))
    autoscale = serializers.JSONField(required=False, help_text=(
        'instances per host by queue time: {"min_instances": 1, "max_instances": 4, "queue_ms_high": 20, '
        '"queue_ms_low": 2}; without min_instances and max_instances they default from the version\'s '
        'performance card'))
    config = serializers.ChoiceField(choices=["recommended"], required=False, help_text=(
        '"recommended": serve with the config the version\'s performance card recommends (instead of '
        'config_overrides)'))
    confirm_breaking = serializers.BooleanField(default=False, help_text=(
        "roll out even though the version breaks the signature (inputs, outputs, batching) of a version it "
        "replaces; without it such a rollout is refused with 409 naming what breaks"))
    canary_percent = serializers.FloatField(min_value=0, max_value=100, required=False, help_text=(
        "0-100: a canary: each host keeps the version it serves and its gateway sends this share of the requests "
        "that name no version to the new one (Triton hosts with a gateway, each serving a version already)"))
    shadow_percent = serializers.FloatField(min_value=0, max_value=100, required=False, help_text=(
        "0-100: mirror this share of the requests that name no version to the new one, its answers discarded "
        "(nginx's mirror); without canary_percent, a shadow deployment (canary_percent 0)"))
    max_request_bytes = serializers.IntegerField(
        min_value=MIN_REQUEST_BYTES, max_value=MAX_REQUEST_BYTES, required=False, allow_null=True, help_text=(
            "bytes: the most an infer request body may hold at each host's gateway (413 beyond), capped by the "
            "host's --max-request-bytes; default: derived from the version's signature (max_batch_size x dims x "
            "data type, and a bound per JSON element), the host's default where its dims vary"))
    residency = serializers.ChoiceField(choices=Residency.choices, default=Residency.ALWAYS, help_text=(
        '"on_demand": registered on each host but loaded at its first request (which the gateway holds until '
        'then) and evicted, the least asked-for first, when the host\'s memory budget needs room; Triton hosts '
        'with a gateway only. "always": loaded while it serves'))
    pinned = serializers.BooleanField(default=False, help_text="on demand: never evicted once loaded")
    cold_start_timeout = serializers.FloatField(min_value=0.1, max_value=600, required=False, allow_null=True,
                                                help_text=("seconds the gateway holds a request while an on-demand "
                                                           "model loads, 503 with Retry-After past it; default 30"))


class InferenceRequestSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/models/<name>/infer/``."""

    host = serializers.CharField(max_length=200)
    version = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None,
                                       help_text="omit to let the host answer with the version it serves")
    inputs = serializers.DictField(help_text='input tensors by name with the batch dimension, e.g. {"input": [[1.0]]}')


class InferenceResultSerializer(serializers.Serializer):
    """What one Try-it inference returned."""

    host = serializers.CharField()
    model = serializers.CharField()
    version = serializers.IntegerField()
    outputs = serializers.DictField(child=serializers.JSONField())
    shapes = serializers.DictField(child=serializers.ListField(child=serializers.IntegerField()))
    latency_ms = serializers.FloatField(help_text="the runtime's round trip, milliseconds, measured where the "
                                                  "request was sent from (the host's agent, or the web tier)")
    route = serializers.ChoiceField(choices=settings.TRY_IT_ROUTES,
                                    help_text="agent: over the broker through the host's agent; direct: to its "
                                              "inference URL (MODELYARD_TRY_IT_ROUTE)")
    route_ms = serializers.FloatField(help_text="the whole call as the web tier saw it, milliseconds")


class ModelUnloadSerializer(RefuseUnknownFields, serializers.Serializer):
    """What an unload stopped serving."""

    host = serializers.CharField()
    model = serializers.CharField()
    version = serializers.IntegerField()


class ResidentModelSerializer(serializers.Serializer):
    """One model on demand on a host, as its gateway last reported it (``deployments.heartbeats``)."""

    model = serializers.CharField()
    state = serializers.CharField(allow_null=True, help_text="resident, cold (loaded at its next request) or evicting")
    pinned = serializers.BooleanField(allow_null=True, help_text="never evicted")
    held = serializers.IntegerField(allow_null=True, help_text="requests held now, waiting for it to load")
    requests = serializers.IntegerField(allow_null=True, help_text="requests for it since the gateway started")
    last_used = serializers.FloatField(allow_null=True, help_text="when a request last asked for it (epoch seconds)")
    wanted = serializers.BooleanField(allow_null=True, help_text="a held request asked its load")
    failure = serializers.JSONField(allow_null=True, help_text="{message, retry_after} of its last failed load")
    cold_start_timeout = serializers.FloatField(allow_null=True, help_text="seconds a request is held at most")
    max_held = serializers.IntegerField(allow_null=True, help_text="requests held at once at most")


class HostResidencySerializer(serializers.Serializer):
    """``GET /api/v1/hosts/<name>/residency/``: the host's models on demand and its memory budget."""

    host = serializers.CharField()
    reported_at = serializers.DateTimeField(allow_null=True, help_text="the heartbeat these figures come from")
    budget = serializers.JSONField(help_text=(
        "{budget_bytes (what each device may hold), resident_bytes (what the fullest device holds; bytes, null "
        "without a budget), devices ({device: bytes held}: each GPU by its uuid, and cpu for models that use no "
        "GPU)} and problem: why the budget cannot be held as measured (\"budget not enforceable as measured: ...\"), "
        "or an empty string"))
    models = ResidentModelSerializer(many=True, help_text="the models the caller may read, by name")


class ProfileCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/models/<m>/versions/<n>/profiles/``."""

    host = serializers.CharField(max_length=200, help_text="the host to measure on (a staging host)")
    sweep = serializers.JSONField(required=False, help_text=(
        'a preset\'s name ("quick", "standard") or an object: instance_counts, dynamic_batching, '
        "max_batch_sizes, preferred_batch_sizes, max_queue_delay_us, concurrency, measurement_interval_ms, "
        "stability_percentage, max_trials, time_budget_s (missing fields from its preset)"))
    slo_p99_ms = serializers.FloatField(required=False, min_value=0.001, max_value=600_000,
                                        help_text="client p99 target in milliseconds the recommendation meets")


class ProfileRowSerializer(serializers.Serializer):
    """One measurement: a config at one concurrency level (throughput in inferences/s, times in ms)."""

    config = serializers.JSONField()
    concurrency = serializers.IntegerField(allow_null=True)
    throughput = serializers.FloatField(required=False, help_text="inferences per second")
    p50_ms = serializers.FloatField(required=False)
    p90_ms = serializers.FloatField(required=False)
    p95_ms = serializers.FloatField(required=False)
    p99_ms = serializers.FloatField(required=False)
    queue_ms = serializers.FloatField(required=False, allow_null=True,
                                      help_text="the server's mean queue time per request")
    compute_ms = serializers.FloatField(required=False, allow_null=True,
                                        help_text="the server's mean compute time per request")
    memory_bytes = serializers.IntegerField(required=False, allow_null=True,
                                            help_text="memory the config's load took")
    memory_kind = serializers.CharField(required=False, allow_null=True, help_text='"gpu" or "cpu"')
    measurement_interval_ms = serializers.IntegerField(
        required=False, help_text="the measurement window of the run that measured the row (twice the sweep's "
                                  "for a level measured again because it did not stabilise)")
    error = serializers.CharField(required=False)


class ProfileSerializer(serializers.ModelSerializer):
    """A performance profile: status, progress, every row measured and the recommendation."""

    model = serializers.CharField(source="version.model.name")
    version = serializers.IntegerField(source="version.version")
    host = serializers.CharField(source="host.name")
    status = serializers.ChoiceField(choices=JobStatus.choices)
    progress = serializers.SerializerMethodField()
    rows = ProfileRowSerializer(many=True)
    recommended = serializers.SerializerMethodField()
    created_by = serializers.CharField(source="created_by.username", default=None)

    class Meta:
        model = Profile
        fields = ["id", "model", "version", "host", "status", "progress", "message", "slo_p99_ms", "sweep", "rows",
                  "recommended", "created_by", "created_at", "started_at", "finished_at"]

    @extend_schema_field({"type": "object", "properties": {
        "done": {"type": "integer"}, "total": {"type": "integer"}, "step": {"type": "string"}}})
    def get_progress(self, profile: Profile) -> dict:

        return profile_progress(profile)

    @extend_schema_field({"type": "object", "nullable": True, "description": (
        "the config with the highest throughput whose p99 meets slo_p99_ms: config, concurrency, throughput, "
        "p99_ms, memory_bytes, and config_overrides that serve with it")})
    def get_recommended(self, profile: Profile) -> dict | None:

        best = profile.recommended
        return {**best, "config_overrides": overrides_for(profile.version, best["config"])} if best else None


class ReplayTolerancesSerializer(RefuseUnknownFields, serializers.Serializer):
    """How close a candidate's answers must be to the serving version's (``modelyard_agent.replay.compare``)."""

    atol = serializers.FloatField(required=False, min_value=0, help_text="absolute tolerance of float outputs")
    rtol = serializers.FloatField(required=False, min_value=0, help_text=(
        "relative tolerance of float outputs: |candidate - serving| <= atol + rtol * |serving| (numpy.isclose)"))
    argmax_outputs = serializers.ListField(child=serializers.CharField(max_length=200), required=False,
                                           max_length=64, help_text="outputs compared by argmax over the last axis")


class ReplayCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/models/<m>/versions/<n>/replays/``."""

    against = serializers.CharField(max_length=63, help_text=(
        "the version the captured requests are compared against: a version number or an alias (production)"))
    host = serializers.CharField(max_length=200, required=False, help_text=(
        "the host to replay on; default: the host serving that version that captured the most requests"))
    tolerances = ReplayTolerancesSerializer(required=False)
    max_requests = serializers.IntegerField(required=False, min_value=1, max_value=100_000,
                                            help_text="captured requests to replay, newest first (default 1000)")
    pace = serializers.FloatField(required=False, min_value=0.01, max_value=1000, help_text=(
        "captured requests per second (default 20), each sent to both versions, one request in flight"))


_LATENCY = {"type": "object", "properties": {
    "count": {"type": "integer"}, "p50": {"type": "number", "nullable": True},
    "p95": {"type": "number", "nullable": True}, "mean": {"type": "number", "nullable": True}}}


class ReplaySerializer(serializers.ModelSerializer):
    """A replay: status, progress, and what it found. ``worst`` (the worst disagreements, with both versions'
    answers to users' inputs) is shown to owners of the model's team only; null for everyone else."""

    model = serializers.CharField(source="version.model.name")
    version = serializers.IntegerField(source="version.version")
    against = serializers.IntegerField(source="against.version")
    host = serializers.CharField(source="host.name")
    status = serializers.ChoiceField(choices=JobStatus.choices)
    progress = serializers.SerializerMethodField()
    agreement_rate = serializers.FloatField(allow_null=True, read_only=True,
                                            help_text="agreeing requests over compared ones, 0..1")
    compared = serializers.SerializerMethodField()
    skipped = serializers.SerializerMethodField()
    differences = serializers.SerializerMethodField()
    disagreed_outputs = serializers.SerializerMethodField()
    latency_ms = serializers.SerializerMethodField()
    latency_regression = serializers.FloatField(allow_null=True, read_only=True, help_text=(
        "the candidate's p95 over the serving version's, minus 1 (0.2: 20 % slower)"))
    worst = serializers.SerializerMethodField()
    created_by = serializers.CharField(source="created_by.username", default=None)

    class Meta:
        model = Replay
        fields = ["id", "model", "version", "against", "host", "status", "progress", "message", "tolerances",
                  "max_requests", "pace", "agreement_rate", "compared", "skipped", "differences", "disagreed_outputs",
                  "latency_ms", "latency_regression", "worst", "created_by", "created_at", "started_at",
                  "finished_at"]

    def _summary(self, replay: Replay) -> dict:
        return replay.summary or {}

    @extend_schema_field({"type": "object", "properties": {
        "done": {"type": "integer"}, "total": {"type": "integer"}, "step": {"type": "string"}}})
    def get_progress(self, replay: Replay) -> dict:
        return {"done": replay.done, "total": replay.total, "step": replay.step}

    @extend_schema_field(serializers.IntegerField())
    def get_compared(self, replay: Replay) -> int:
        return int(self._summary(replay).get("compared") or 0)

    @extend_schema_field(serializers.IntegerField(help_text="requests the serving version did not answer"))
    def get_skipped(self, replay: Replay) -> int:
        return int(self._summary(replay).get("skipped") or 0)

    @extend_schema_field({"type": "object", "description": (
        "per-request max absolute differences: histogram [{upto (null: above the last edge), count}], "
        "nonfinite, p50, p90, p99, max")})
    def get_differences(self, replay: Replay) -> dict:
        return self._summary(replay).get("differences") or {}

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"},
                          "description": "requests that disagreed, by the first output that did"})
    def get_disagreed_outputs(self, replay: Replay) -> dict:
        return self._summary(replay).get("disagreed_outputs") or {}

    @extend_schema_field({"type": "object", "properties": {"serving": _LATENCY, "candidate": _LATENCY},
                          "description": "each side's round trip on the host, milliseconds"})
    def get_latency_ms(self, replay: Replay) -> dict:
        return self._summary(replay).get("latency_ms") or {}

    @extend_schema_field({"type": "array", "nullable": True, "items": {"type": "object"}, "description": (
        "the worst disagreements, worst first: id (the captured request's), max_abs_diff, max_rel_diff, output, "
        "reason, serving and candidate outputs (cut to a byte bound); null unless you own the model's team")})
    def get_worst(self, replay: Replay) -> list | None:

        request = self.context.get("request")
        if request is None or not may_read_captured(Principal.of(request), replay.version.model):
            return None
        return list(self._summary(replay).get("worst") or [])
class CaptureUpdateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``PATCH /api/v1/models/<name>/capture/``: any field may be left out (it stays as it is)."""

    fraction = serializers.FloatField(required=False, min_value=0, max_value=1,
                                      help_text="share of client infer requests captured, 0 (off) to 1")
    max_bytes = serializers.IntegerField(required=False, min_value=1,
                                         help_text="most bytes of captured requests per host, up to "
                                                   "MODELYARD_CAPTURE_MAX_BYTES_LIMIT")
    retention_seconds = serializers.IntegerField(required=False, min_value=1,
                                                 help_text="seconds a captured request is kept, 3600 up to "
                                                           "MODELYARD_CAPTURE_MAX_RETENTION_SECONDS")

    def validate_fraction(self, value):
        if isinstance(self.initial_data.get("fraction"), bool):
            raise serializers.ValidationError("must be a number from 0 to 1, not a boolean")
        return value


class CaptureHostSerializer(serializers.Serializer):
    """What one Triton host serving the model last reported of its capture."""

    host = serializers.CharField()
    requests = serializers.IntegerField(allow_null=True, help_text="captured requests on disk")
    bytes = serializers.IntegerField(allow_null=True, help_text="bytes on disk")
    oldest = serializers.FloatField(allow_null=True, help_text="unix seconds of the oldest captured request")
    newest = serializers.FloatField(allow_null=True, help_text="unix seconds of the last write")
    skipped = serializers.IntegerField(allow_null=True, help_text="drawn but not captured since the gateway "
                                                                  "started (body over 1 MiB, capture full)")
    applied = serializers.BooleanField(help_text="the host's gateway holds the model's settings")
    problem = serializers.CharField(allow_null=True, help_text="why the host cannot capture now")


class CaptureSerializer(serializers.Serializer):
    """A model's request capture: its settings, each serving host's report, and warnings of the last change."""

    fraction = serializers.FloatField()
    max_bytes = serializers.IntegerField(help_text="bytes per host")
    retention_seconds = serializers.IntegerField()
    hosts = CaptureHostSerializer(many=True)
    warnings = serializers.ListField(child=serializers.CharField(), help_text="hosts the change cannot reach now")
