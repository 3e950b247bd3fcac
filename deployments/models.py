"""Serving hosts, deployments and the per-host state of each deployment."""

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from deployments.choices import (
    CanaryState,
    DeploymentStatus,
    FailurePolicy,
    JobStatus,
    Residency,
    RolloutTrigger,
    Runtime,
    TargetState,
)
from modelyard_agent.contract import MAX_DEADLINE_SECONDS, host_queue
from modelyard_agent.profiling.card import recommend
from registry.models import ModelVersion, RegisteredModel


class ServingHost(models.Model):
    """A machine running a serving runtime, with a host agent on queue ``host.<name>``.

    ``config_overrides`` holds per-host model config overrides applied at load
    time, e.g. ``{"parameters": {"EXECUTION_ENV_PATH": "/opt/envs/py311"}}``. ``production``
    hosts take rollouts only from a team's owners (``accounts.access``). ``load_deadline`` and
    ``unload_deadline`` bound, in seconds, how long the host's agent waits for one load or unload
    (blank: ``MODELYARD_AGENT_LOAD_TIMEOUT`` / ``MODELYARD_AGENT_UNLOAD_TIMEOUT``); past it the agent
    abandons the load and the old version keeps serving.
    """

    name = models.CharField(max_length=63, unique=True)
    runtime = models.CharField(max_length=16, choices=Runtime.choices, default=Runtime.TRITON)
    # Checked and normalised by deployments.endpoints (Django's URL validator refuses host names
    # without a dot, such as gpu-0, and lets credentials through).
    inference_url = models.CharField(max_length=200,
                                     help_text="Base URL of the runtime's HTTP endpoint, e.g. http://gpu-0:8000")
    metrics_url = models.CharField(max_length=200, blank=True,
                                   help_text="Prometheus metrics URL, e.g. http://gpu-0:8002/metrics")
    config_overrides = models.JSONField(default=dict, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    production = models.BooleanField(
        default=False, help_text="Serves production traffic: deploying here needs a team owner, not a maintainer"
    )
    load_deadline = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_DEADLINE_SECONDS)],
        help_text="seconds one load may take on this host; blank: the fleet default",
    )
    unload_deadline = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(MAX_DEADLINE_SECONDS)],
        help_text="seconds one unload may take on this host; blank: the fleet default",
    )
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeat = models.JSONField(default=dict, blank=True, help_text="What the host agent last reported")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def agent_is_reporting(self, now=None) -> bool:
        """True when the host's agent reported within ``settings.HOST_OFFLINE_AFTER`` seconds (90 by
        default): it is there to take a task, whatever its runtime's state."""
        from django.conf import settings
        from django.utils import timezone

        if self.last_heartbeat_at is None:
            return False
        age = ((now or timezone.now()) - self.last_heartbeat_at).total_seconds()
        return age <= settings.HOST_OFFLINE_AFTER

    def is_online(self, now=None) -> bool:
        """True when the agent reported within ``settings.HOST_OFFLINE_AFTER`` seconds and its runtime was live."""
        return self.agent_is_reporting(now=now) and bool(self.heartbeat.get("runtime_live"))

    @property
    def load_deadline_seconds(self) -> float:
        """Seconds one load may take here: the host's own deadline, else the fleet default."""
        from django.conf import settings

        return float(self.load_deadline or settings.AGENT_LOAD_TIMEOUT)

    @property
    def unload_deadline_seconds(self) -> float:
        """Seconds one unload may take here: the host's own deadline, else the fleet default."""
        from django.conf import settings

        return float(self.unload_deadline or settings.AGENT_UNLOAD_TIMEOUT)

    def stuck_versions(self, now=None) -> list[dict]:
        """Model versions the last report shows LOADING or UNLOADING for longer than this host's deadline.

        The time a version entered that state comes from ``record_heartbeat``, which keeps the first
        report that showed it (``since``, ISO 8601).

        Returns:
            ``[{"name", "version", "state", "reason", "seconds", "deadline"}]`` (seconds as ints),
            ordered by model name and version; empty when nothing is stuck.
        """
        from django.utils import timezone
        from django.utils.dateparse import parse_datetime

        now = now or timezone.now()
        stuck = []
        for entry in (self.heartbeat or {}).get("models") or []:
            state = entry.get("state")
            since = parse_datetime(entry.get("since") or "") if isinstance(entry.get("since"), str) else None
            if state not in ("LOADING", "UNLOADING") or since is None:
                continue
            deadline = self.load_deadline_seconds if state == "LOADING" else self.unload_deadline_seconds
            seconds = (now - since).total_seconds()
            if seconds > deadline:
                stuck.append({"name": entry.get("name"), "version": entry.get("version"), "state": state,
                              "reason": entry.get("reason") or "", "seconds": int(seconds), "deadline": int(deadline)})
        return sorted(stuck, key=lambda row: (str(row["name"]), row["version"] or 0))

    @property
    def queue(self) -> str:
        """The Celery queue this host's agent consumes."""
        return host_queue(self.name)


class Deployment(models.Model):
    """A rollout: one model version onto a set of hosts, moved in batches.

    ``batch_size`` is the most hosts moved at once (max unavailable; each host loads the new
    version beside the old one, so a host in a batch keeps serving). ``follow_alias`` names the
    alias this deployment tracks: moving it starts the next rollout to the same hosts by itself.
    ``selector`` is the label selector the hosts were chosen by (empty when named);
    ``config_overrides`` is a partial Triton model config applied at load (instance_group,
    dynamic_batching, max_batch_size). ``rollback_of`` links a rollback to the rollout it undoes;
    ``prerequisite_for`` links the rollout of an ensemble's composing model to the ensemble's,
    which dispatches no host before its prerequisites succeed. ``trigger`` says what started the
    rollout; ``autoscale`` bounds the instance count the autoscaler may set on each host (see
    ``deployments.autoscale``).
    ``canary_percent`` makes it a canary (``deployments.canaries``): each host keeps the version it
    served beside this one, and that percent of the requests naming no version go to this one;
    ``shadow_percent`` mirrors that share of them to this one, answers discarded (with a canary
    percent of 0, a shadow deployment); ``canary_state`` says where either stands.
    ``status`` changes only through ``deployments.rollouts.set_status``, each change a
    ``RolloutEvent``.
    """

    model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="deployments")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="deployments")
    hosts = models.ManyToManyField(ServingHost, through="DeploymentTarget", related_name="deployments")
    status = models.CharField(max_length=16, choices=DeploymentStatus.choices, default=DeploymentStatus.RUNNING)
    batch_size = models.PositiveIntegerField(default=1, help_text="hosts moved at once (max unavailable)")
    failure_policy = models.CharField(max_length=16, choices=FailurePolicy.choices, default=FailurePolicy.PAUSE)
    follow_alias = models.CharField(max_length=63, blank=True)
    selector = models.JSONField(default=dict, blank=True)
    config_overrides = models.JSONField(default=dict, blank=True)
    rollback_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="rollbacks"
    )
    trigger = models.CharField(max_length=16, choices=RolloutTrigger.choices, default=RolloutTrigger.OPERATOR)
    autoscale = models.JSONField(default=dict, blank=True, help_text=(
        '{"min_instances": 1, "max_instances": 4, "queue_ms_high": 20, "queue_ms_low": 2}; empty: off'))
    prerequisite_for = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="prerequisites",
        help_text="the ensemble rollout that waits for this one (a composing model deployed first)",
    )
    canary_percent = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="0-100: the share of requests naming no version sent to this version beside the stable one; "
                  "empty: not a canary")
    shadow_percent = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(100)],
        help_text="0-100: the share of requests naming no version mirrored to this version, its answers discarded; "
                  "empty: no shadow")
    canary_state = models.CharField(max_length=16, choices=CanaryState.choices, blank=True)
    max_request_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1024)],
        help_text="bytes: the most an infer request body may hold at the hosts' gateways; empty: the bound of the "
                  "version's signature (the host's default where its dims vary)")
    residency = models.CharField(max_length=16, choices=Residency.choices, default=Residency.ALWAYS, help_text=(
        "always: loaded while it serves; on_demand: loaded at its first request, evicted when the host needs room"))
    pinned = models.BooleanField(default=False, help_text="on demand: never evicted once loaded")
    cold_start_timeout = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.1), MaxValueValidator(600)],
        help_text="seconds: on demand, how long the gateway holds a request while the model loads (503 after); "
                  "empty: 30 s")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["model", "follow_alias", "-created_at"], name="deployment_follow_idx")]

    def __str__(self) -> str:
        return f"deployment {self.pk} of {self.version}"

    def residency_settings(self) -> dict:
        """``{"residency", "pinned", "cold_start_timeout"}``: what a rollout that repeats this one (a repair,
        a rollback, the autoscaler's) passes to ``services.create_rollout`` to keep the model's residency."""
        return {"residency": self.residency, "pinned": self.pinned, "cold_start_timeout": self.cold_start_timeout}


class DeploymentTarget(models.Model):
    """One host's part of a deployment and where it stands.

    ``details`` holds what the host agent reported: the versions it replaced,
    step durations in seconds. ``served_name`` is the model's name on the host's runtime
    (``host_served_name``).
    """


    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="targets")
    host = models.ForeignKey(ServingHost, on_delete=models.CASCADE, related_name="targets")
    batch = models.PositiveIntegerField(default=0, help_text="0-based; batches move one after another")
    previous_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="what the host served of this model when the rollout began (a rollback's destination)",
    )
    dispatched_at = models.DateTimeField(null=True, blank=True)
    served_name = models.CharField(
        max_length=63, blank=True,
        help_text="the name the model has on this host's runtime: its name when it was first deployed there, "
                  "kept across renames so its copies stay manageable and no other model takes the name",
    )
    state = models.CharField(max_length=16, choices=TargetState.choices, default=TargetState.PENDING)
    error = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["host__name"]
        constraints = [models.UniqueConstraint(fields=["deployment", "host"], name="unique_deployment_host")]

    def __str__(self) -> str:
        return f"{self.deployment_id}@{self.host_id}: {self.state}"

    @property
    def runtime_name(self) -> str:
        """The model's name on the host's runtime (its registry name for targets made before names were kept)."""
        return self.served_name or self.deployment.model.name


class TargetEvent(models.Model):
    """One state change of a deployment target: the history behind its state."""

    target = models.ForeignKey(DeploymentTarget, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16, choices=TargetState.choices)
    to_state = models.CharField(max_length=16, choices=TargetState.choices)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.target_id}: {self.from_state} -> {self.to_state}"


class RolloutEvent(models.Model):
    """One status change of a deployment's rollout, with who or what caused it."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    from_status = models.CharField(max_length=16, choices=DeploymentStatus.choices)
    to_status = models.CharField(max_length=16, choices=DeploymentStatus.choices)
    actor_label = models.CharField(max_length=150, blank=True)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.deployment_id}: {self.from_status} -> {self.to_status}"


class AgentJob(models.Model):
    """What every agent job (``deployments.agent_jobs``) records: the host whose agent runs it, where it
    stands (``status``, moved by ``choices.JOB_MACHINE``), what the agent does now (``step``), the
    outcome's ``message`` and ``details``, who asked for it and when it was created, started, finished
    and last reported on (``updated_at``, which stall detection reads)."""

    host = models.ForeignKey(ServingHost, on_delete=models.CASCADE, related_name="%(class)ss")
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    step = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class Profile(AgentJob):
    """A performance card: one model version measured on one host under a sweep of serving configs.

    The host's agent loads a copy of the version under a name of its own for each config of
    ``sweep`` (``modelyard_agent.profiling.sweep.Sweep.as_dict``) and runs Triton's perf_analyzer
    (wrk for BentoML) at each concurrency level. ``rows`` are its measurements
    (``modelyard_agent.contract.ProfileRow``: throughput in inferences/s, latencies in ms, memory in
    bytes), reported as they come; ``step`` is what the agent does now. ``slo_p99_ms`` is the
    latency target the recommendation is chosen for (``recommended``).
    """

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="profiles")
    sweep = models.JSONField(help_text="the checked sweep: configs, concurrency levels, measurement settings")
    slo_p99_ms = models.FloatField(null=True, blank=True, validators=[MinValueValidator(0.001)],
                                   help_text="client p99 latency target, milliseconds")
    rows = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["version", "status", "-created_at"], name="profile_version_idx"),
                   models.Index(fields=["host", "status"], name="profile_host_idx")]

    def __str__(self) -> str:
        return f"profile {self.pk} of {self.version} on {self.host_id}"

    @property
    def runs(self) -> int:
        """Measurements the sweep holds: configs × concurrency levels."""
        return len(self.sweep.get("configs") or []) * len(self.sweep.get("concurrency") or [])

    @property
    def recommended(self) -> dict | None:
        """The config with the highest throughput whose p99 meets ``slo_p99_ms``, and its concurrency
        (``modelyard_agent.profiling.card.recommend``); None when no row meets it."""

        return recommend(self.rows, self.slo_p99_ms)


class Replay(AgentJob):
    """Captured requests of a model replayed on one host against a candidate version and the version served.

    The host's agent loads ``version`` (the candidate) as a copy of its own and sends each captured
    request (newest first, at most ``max_requests``, ``pace`` per second, one in flight) to Triton's
    ``against`` version and to the copy, and compares the answers with ``tolerances``
    (``modelyard_agent.replay.compare.Tolerances.as_dict``). ``summary`` is the agent's
    ``Summary.as_dict`` (agreement rate 0..1, max-absolute-difference histogram and quantiles, latency
    in milliseconds of each side, the worst disagreements with both outputs: users' data, shown to the
    model team's owners only). ``done``/``total`` count requests; ``step`` is what the agent does now.
    """

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="replays",
                                help_text="the candidate version")
    against = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="+",
                                help_text="the version the host serves, whose answers are the reference")
    tolerances = models.JSONField(help_text="atol, rtol, argmax_outputs")
    max_requests = models.PositiveIntegerField()
    pace = models.FloatField(help_text="captured requests replayed per second")
    time_budget_s = models.FloatField(help_text="seconds the whole replay may take on the host")
    done = models.PositiveIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    summary = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["version", "against", "status", "-finished_at"], name="replay_pair_idx"),
                   models.Index(fields=["host", "status"], name="replay_host_idx")]

    def __str__(self) -> str:
        return f"replay {self.pk} of {self.version} against v{self.against.version} on {self.host_id}"

    @property
    def agreement_rate(self) -> float | None:
        """Agreeing requests over compared ones (0..1), None before any was compared."""
        return (self.summary or {}).get("agreement_rate")

    def latency(self, side: str, quantile: str = "p95") -> float | None:
        """``side`` ("serving" or "candidate")'s round-trip ``quantile`` ("p50", "p95"), milliseconds."""
        return ((self.summary or {}).get("latency_ms") or {}).get(side, {}).get(quantile)

    @property
    def latency_regression(self) -> float | None:
        """The candidate's p95 over the serving version's, minus 1 (0.2: 20 % slower); None without both."""
        candidate, serving = self.latency("candidate"), self.latency("serving")
        return candidate / serving - 1 if candidate is not None and serving else None
