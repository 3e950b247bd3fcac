"""The contract between the orchestrator and the host agents: queues, task names, payloads, reports.

Both sides import this module for everything they say to each other. The orchestrator (the Django
project's Celery workers) sends work to a host's queue by task name, and an agent reports back to
the orchestrator's queue by task name, so neither imports the other's tasks; tasks travel as JSON
(Celery's ``json`` serializer). The orchestrator also uses some of the agent package's Django-free
helpers (``claims``, ``inference``, ``formats``); the agent imports nothing of the orchestrator.

Every payload the orchestrator sends carries ``protocol``: the ``PROTOCOL_VERSION`` it was built
for. An agent refuses a payload of a newer protocol than its own (``check_protocol``) and reports
why instead of guessing at fields it does not know, so hosts can be upgraded one at a time: an
older orchestrator's payloads (a lower number, or none at all, which is protocol 1) still work.
Raise ``PROTOCOL_VERSION`` when a payload field changes meaning or becomes required; adding an
optional field an older agent may ignore needs no new version.

Protocol history:

1. payloads without ``protocol`` (before this module).
2. ``protocol`` on every payload; ``archive_limits`` on deploy payloads; heartbeat reports carry
   the agent's ``agent`` block (``AgentInfo``); the ``INFER`` task.
3. the ``PROFILE`` task and its ``PROFILE_REPORT``; ``config_overrides`` may set
   ``dynamic_batching`` to null (off). The orchestrator sends ``PROFILE`` only to agents that
   report protocol 3 or newer.
4. ``canary_percent`` and ``shadow_percent`` on deploy payloads (an older agent would cut over instead of keeping the
   stable version), the ``ROUTE`` task, and the ``gateway`` block of Triton heartbeat reports. The
   orchestrator sends canaries and routes only to agents that report protocol 4 and a live gateway.
   BentoML agents that split traffic (an nginx with the Lua module) report the same ``gateway`` block;
   older BentoML agents report none, so they are never sent a canary (no new protocol number).
5. the ``REPLAY`` task and its ``REPLAY_REPORT`` (captured requests sent again to the serving version and
   to a candidate's copy); request capture: ``capture`` (``CaptureSettings``) on ``ROUTE`` payloads, which
   may then carry no canary (the version the host serves as ``stable``), and ``capture`` in the ``gateway``
   block of Triton heartbeat reports. The orchestrator sends ``REPLAY`` and capture settings only to agents
   that report protocol 5 or newer. Models on demand: ``residency``, ``pinned`` and ``cold_start_timeout`` on
   deploy payloads, ``residency`` in the ``gateway`` block, and heartbeat rows of state ``REGISTERED``
   (no new protocol number: an agent that ignores ``residency`` keeps the model loaded, as "always").
6. the ``KEYS`` task (``KeysPayload``): the inference keys a host's front checks for its models that require
   one. The orchestrator sends it to every host of a model whose keys or requirement changed; an older agent
   has no such task and checks no key, so a keyed model's page names such hosts.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NotRequired, TypedDict

PROTOCOL_VERSION = 6
# The oldest agent protocol that runs ``AgentTask.PROFILE``.
PROFILE_PROTOCOL = 3
# The oldest agent protocol that keeps a canary beside the stable version and runs ``AgentTask.ROUTE``.
CANARY_PROTOCOL = 4
# The oldest agent protocol that runs ``AgentTask.REPLAY``.
REPLAY_PROTOCOL = 5
# The oldest agent protocol whose gateway captures requests (``RoutePayload.capture``).
CAPTURE_PROTOCOL = 5
# The oldest agent protocol whose front checks inference keys (``AgentTask.KEYS``).
KEYS_PROTOCOL = 6

# The longest load or unload deadline a host may set, and an agent may default to, in seconds: one
# day; a deadline longer than that is a host that is down, not a load that is slow.
MAX_DEADLINE_SECONDS = 86_400
# Bounds of a request body limit at a host's gateway, in bytes (the host's --max-request-bytes and a
# deployment's max_request_bytes), and the host's default (Triton's own HTTP input limit is 64 MiB as well).
MIN_REQUEST_BYTES, MAX_REQUEST_BYTES = 1024, 1 << 32
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024

ORCHESTRATOR_QUEUE = "default"
HOST_QUEUE_PREFIX = "host."


def host_queue(host: str) -> str:
    """The Celery queue host ``host``'s agent consumes (Celery's Redis transport keeps it as a list
    of that name): ``host.<name>``."""
    return f"{HOST_QUEUE_PREFIX}{host}"


def host_broker_patterns(host: str) -> tuple[str, ...]:
    """Redis ``SCAN MATCH`` patterns of every broker key that belongs to host ``host`` alone: its queue
    (with the priority lists and binding sets of Celery's Redis transport), its agent's (host, model)
    locks, start time, work under way and profile and replay locks, and the orchestrator's repair
    back-offs for it. Glob characters in the name are escaped (host names cannot hold them today)."""
    name = "".join(f"\\{char}" if char in "*?[]\\" else char for char in host)
    queue = f"{HOST_QUEUE_PREFIX}{name}"
    return (queue, f"{queue}\x06\x16*", f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}",
            f"modelyard:lock:{name}:*",
            f"modelyard:agent:{name}:*", f"modelyard:profile-lock:{name}", f"modelyard:replay-lock:{name}",
            f"modelyard:repair-stuck:{name}:*", f"modelyard:route-repair:{name}:*")


class AgentTask(StrEnum):
    """Tasks an agent runs, sent by the orchestrator to ``host_queue(host)``; each takes one payload."""

    DEPLOY = "deployments.deploy_version_on_host"  # DeployPayload
    UNLOAD = "deployments.unload_model_on_host"  # UnloadPayload
    HEARTBEAT = "deployments.report_heartbeat"  # HeartbeatRequest
    CHECK_ENSEMBLE = "deployments.check_ensemble_on_host"  # DeployPayload of the ensemble version
    INFER = "deployments.infer_on_host"  # InferPayload: "Try it", answered on the payload's reply list
    PROFILE = "deployments.profile_version_on_host"  # ProfilePayload: a performance card
    ROUTE = "deployments.route_model_on_host"  # RoutePayload: a canary's percent on the host's gateway
    REPLAY = "deployments.replay_version_on_host"  # ReplayPayload: captured requests against a candidate
    KEYS = "deployments.set_inference_keys_on_host"  # KeysPayload: the keys the host's front accepts per model


class OrchestratorTask(StrEnum):
    """Tasks an agent sends to ``ORCHESTRATOR_QUEUE`` to report."""

    TARGET_REPORT = "deployments.record_target_report"  # args: target_id, state, message, details
    HOST_HEARTBEAT = "deployments.record_host_heartbeat"  # args: host name, HeartbeatReport
    PROFILE_REPORT = "deployments.record_profile_report"  # args: profile_id, ProfileReport
    REPLAY_REPORT = "deployments.record_replay_report"  # args: replay_id, ReplayReport


class Runtime(StrEnum):
    """The serving runtime a host runs."""

    TRITON = "triton"
    BENTOML = "bentoml"


class TargetState(StrEnum):
    """Where one host stands in carrying out a deployment. An agent reports STAGING, LOADING,
    VERIFYING and CUTTING_OVER as it goes, then READY, FAILED or CANCELLED; the orchestrator
    alone sets PENDING and UNLOADED."""

    PENDING = "pending"
    STAGING = "staging"
    LOADING = "loading"
    VERIFYING = "verifying"
    CUTTING_OVER = "cutting_over"
    READY = "ready"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNLOADED = "unloaded"


class JobStatus(StrEnum):
    """Where an agent job (a profile, a replay) stands. The orchestrator sets QUEUED; the agent reports
    RUNNING (with progress), then SUCCEEDED, FAILED or CANCELLED."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


# Artifact formats (the registry's ``ArtifactFormat`` values) a BentoML host imports: a Bento, which
# it serves, and a Bento model, which it only stores.
BENTO = "bento"
BENTO_MODEL = "bentomodel"


class ArchiveLimitsPayload(TypedDict):
    """The registry's archive limits, checked again by the agent before it unpacks."""

    max_unpacked_bytes: int  # bytes
    max_compression_ratio: int  # unpacked bytes per archive byte
    max_members: int


class DeployPayload(TypedDict):
    """What an agent needs to carry out one deployment target (built by the orchestrator's
    ``deployments.targets.build_agent_payload``). The agent gets no database or S3 credentials:
    the artifact comes from a presigned URL and is checked against its size and sha256."""

    protocol: int
    target_id: int
    claim: str  # the key the agent and a cancel race for (``modelyard_agent.claims``)
    host: str
    runtime: str  # a Runtime value
    format: str  # the registry's artifact format
    model: str  # the model's name on this host's runtime
    version: int
    artifact_url: str
    sha256: str
    size: int  # bytes
    config_text: str  # config.pbtxt (bento.yaml or model.yaml for BentoML archives)
    parameters: dict[str, str]  # the host's config overrides (``parameters``)
    config_overrides: dict
    sample_input: dict | None
    signature: dict | None
    inference_url: str
    metrics_url: str
    load_deadline: float | None  # seconds; None: the agent's default
    unload_deadline: float | None  # seconds; None: the agent's default
    archive_limits: NotRequired[ArchiveLimitsPayload]
    # 0-100: keep the stable version loaded and send this share of the requests that name no version to
    # this one (a canary, through the host's gateway); absent or None: this version alone serves.
    canary_percent: NotRequired[float | None]
    # 0-100: also mirror this share of those requests to this version (its answers are discarded).
    shadow_percent: NotRequired[float | None]
    # bytes: the most an infer request body to this model may hold at the host's gateway; absent or None:
    # derived from the version's signature (``formats.request_limits``).
    max_request_bytes: NotRequired[int | None]
    # "always" (absent: the same) or "on_demand": registered at the host's gateway, loaded at its first request,
    # evicted when the host's memory budget needs room (``modelyard_agent.residency``).
    residency: NotRequired[str]
    pinned: NotRequired[bool]  # on demand: never evicted
    cold_start_timeout: NotRequired[float | None]  # seconds a request is held while the model loads; None: 30
    # on demand: the most bytes the version held on one device, as its performance card, a deployment's load or a
    # host's on-demand load (``GatewayReport.footprints``) measured it; None: the agent's loader measures it at its
    # first load there
    footprint_bytes: NotRequired[int | None]
    # Protocol 6: the model requires an inference key: the digests of the keys its front accepts ([]: none), set
    # before the version serves (an older agent ignores it and serves the model without a check).
    inference_keys: NotRequired[list[str]]


# The heartbeat state of a version of an on-demand model that Triton does not hold now (Triton's own states are
# READY, LOADING, UNLOADING and UNAVAILABLE): registered, loaded at its next request.
REGISTERED = "REGISTERED"


class CaptureSettings(TypedDict):
    """A model's request capture on a host's gateway (``modelyard_agent.capture``): the share of client infer
    requests kept (0 = off, and what was kept is deleted), the most bytes kept, and for how long."""

    fraction: float  # 0-1
    max_bytes: int  # bytes
    retention_seconds: int  # seconds


class RoutePayload(TypedDict):
    """Split ``model``'s requests that name no version on ``host``'s gateway: ``percent`` (0-100) to
    ``canary``, the rest to ``stable``; both must be READY there. The agent answers with a heartbeat.

    With ``capture`` (protocol 5) it also sets the model's request capture; ``canary`` None and no shadow is
    then the model served by ``stable`` alone (routed to it while capture is on, so each captured request
    names the version that answered)."""

    protocol: int
    host: str
    runtime: str
    model: str  # the model's name on this host's runtime
    inference_url: str
    metrics_url: str
    stable: int
    canary: int | None
    percent: float
    shadow: NotRequired[int | None]  # a version mirrored ``shadow_percent`` of the requests, answers discarded
    shadow_percent: NotRequired[float]
    capture: NotRequired[CaptureSettings]


class KeysPayload(TypedDict):
    """The inference keys ``host``'s front (the Triton gateway, or the BentoML host's nginx) accepts for the models
    ``keys`` names, by their names on the host's runtime: each a list of hex SHA-256 digests of the keys that open
    it (``[]``: none does), or None when the model requires no key. Models not named stay as they are."""

    protocol: int
    host: str
    runtime: str
    inference_url: str
    metrics_url: str
    keys: dict[str, list[str] | None]


class GatewayReport(TypedDict):
    """A Triton host's gateway in a heartbeat: whether it answers, its routes
    (``{model: {"stable", "canary", "percent", "shadow", "shadow_percent"}}``) and, from protocol 5, each
    captured model's settings and what is on disk (``{model: {"fraction", "max_bytes", "retention_seconds",
    "requests", "bytes", "oldest", "newest", "skipped"}}``, times in unix seconds; ``capture.enforce``)."""

    live: bool
    routes: dict[str, dict]
    capture: NotRequired[dict[str, dict]]
    # ``residency_control.ResidencyControl.residency()``: the models registered on demand and their state.
    residency: NotRequired[dict]
    # What the on-demand loader measured, ``{"<model>/<versions>": {device: bytes}}`` (``footprints.footprint_key``:
    # "iris/3", or "iris/2+3" for a canary's two versions loaded together); the control plane sends a version's
    # figure with its next on-demand deployment (``footprint_bytes``) and refuses one larger than a host's budget.
    footprints: NotRequired[dict[str, dict[str, int]]]


class UnloadPayload(TypedDict):
    """Stop serving ``model`` on ``host``."""

    protocol: int
    host: str
    runtime: str
    model: str
    inference_url: str
    metrics_url: NotRequired[str]
    unload_deadline: NotRequired[float | None]


class InferPayload(TypedDict):
    """One inference request for "Try it". The agent pushes its ``InferReply`` as JSON onto the Redis
    list ``reply_to`` in the broker (expiring after ``REPLY_SECONDS``), where the web tier waits."""

    protocol: int
    host: str
    runtime: str
    inference_url: str
    model: str  # the model's name on this host's runtime
    version: int  # the version expected to answer
    pin_version: bool  # ask Triton for that version itself
    inputs: dict  # {input name: nested list}
    signature: dict
    timeout: float  # seconds for the request on the host
    reply_to: str


class InferReply(TypedDict):
    """``{"ok": True, "version", "outputs", "shapes", "latency_ms"}`` (as
    ``modelyard_agent.inference.infer`` returns) or ``{"ok": False, "error", "retryable"}``."""

    ok: bool
    version: NotRequired[int]
    outputs: NotRequired[dict]
    shapes: NotRequired[dict]
    latency_ms: NotRequired[float]  # the request's round trip on the host, milliseconds
    error: NotRequired[str]
    retryable: NotRequired[bool]


REPLY_SECONDS = 60


class StagedJobPayload(TypedDict):
    """What every agent job that stages and loads a copy of a version carries (built by
    ``deployments.agent_jobs.build_payload``): the ``DeployPayload`` fields that stage and load it."""

    protocol: int
    host: str
    runtime: str
    format: str
    model: str  # the model's name on this host's runtime
    version: int
    artifact_url: str
    sha256: str
    size: int  # bytes
    config_text: str
    parameters: dict[str, str]
    sample_input: dict | None
    signature: dict | None
    inference_url: str
    metrics_url: str
    load_deadline: float | None  # seconds
    unload_deadline: float | None  # seconds
    archive_limits: NotRequired[ArchiveLimitsPayload]


class ProfilePayload(StagedJobPayload):
    """Profile one model version on a host: the ``StagedJobPayload`` fields plus the checked sweep
    (``modelyard_agent.profiling.sweep.Sweep.as_dict``). The copy is loaded under a name of its own
    (``profiling.triton.profile_model_name``), never the served model's."""

    profile_id: int
    sweep: dict


class ProfileRow(TypedDict):
    """One measurement of a card: one config at one concurrency level.

    ``throughput`` is in inferences per second; latencies are the client's percentiles and the
    server's average queue and compute time per request, in milliseconds; ``memory_bytes`` is what
    the config's load added (``memory_kind``: "gpu" or "cpu"). A row with ``error`` holds no
    measurement (a level perf_analyzer could not measure stably, a config that did not load)."""

    config: dict  # profiling.sweep.ProfileConfig.as_dict
    concurrency: int | None
    throughput: NotRequired[float]
    p50_ms: NotRequired[float]
    p90_ms: NotRequired[float]
    p95_ms: NotRequired[float]
    p99_ms: NotRequired[float]
    queue_ms: NotRequired[float]
    compute_ms: NotRequired[float]
    memory_bytes: NotRequired[int | None]
    memory_kind: NotRequired[str | None]
    measurement_interval_ms: NotRequired[int]  # the window that measured it (doubled for a level measured again)
    error: NotRequired[str]


class ProfileReport(TypedDict):
    """A profile's progress or result: its status, every row measured so far, the step under way
    (``step``) or the outcome's ``message``, and ``details`` (seconds taken)."""

    status: str  # a JobStatus value
    rows: list[ProfileRow]
    step: NotRequired[str]
    message: NotRequired[str]
    details: NotRequired[dict]


class ReplayPayload(StagedJobPayload):
    """Replay a model's captured requests against a candidate version on a Triton host: the
    ``StagedJobPayload`` fields that stage and load the candidate (``version``, its artifact and config) as
    a copy of its own (``<model>--replay-<id>``), the version that serves there (``serving``, READY on the
    host), and how to compare and pace.

    Each captured request (newest first, at most ``max_requests``) goes to Triton itself at
    ``/v2/models/<model>/versions/<serving>/infer`` and to the copy, one request in flight and at most
    ``pace`` requests per second per side; ``time_budget_s`` bounds the whole replay."""

    replay_id: int
    serving: int  # the version the captured requests are compared against
    tolerances: dict  # replay.compare.Tolerances.as_dict: {"atol", "rtol", "argmax_outputs"}
    max_requests: int
    pace: float  # requests per second, per side
    time_budget_s: float  # seconds
    request_timeout: NotRequired[float]  # seconds for one request on one side


class ReplayReport(TypedDict):
    """A replay's progress or result: its status, the requests done of the total, what it does now
    (``step``) or the outcome's ``message``, the summary so far (``replay.compare.Summary.as_dict``:
    agreement rate, differences, latency in milliseconds, worst disagreements) and ``details``
    (seconds taken, captured requests found, unreadable lines)."""

    status: str  # a JobStatus value
    done: int
    total: int
    summary: dict
    step: NotRequired[str]
    message: NotRequired[str]
    details: NotRequired[dict]


class HeartbeatRequest(TypedDict):
    """Ask a host's agent to report in."""

    protocol: NotRequired[int]
    host: str
    inference_url: str
    metrics_url: str
    runtime: str


class AgentInfo(TypedDict):
    """Who answered a heartbeat: the agent's package version, its protocol, when it started (unix
    seconds; None when unknown) and the work it is carrying out now (``[{"task", "model",
    "target_id"?, "profile_id"?, "replay_id"?, "since": unix seconds}]``). A target dispatched before
    ``started_at`` that is not in ``working_on`` was dropped by a killed predecessor, and the orchestrator
    sends it again."""

    version: str
    protocol: int
    started_at: float | None
    working_on: list[dict]


class HeartbeatReport(TypedDict):
    """What an agent reports about its host; the runtime adapters fill it
    (``modelyard_agent.host_agents``)."""

    runtime_live: bool
    runtime_version: str | None
    models: list[dict]  # [{"name", "version", "state", "reason"?}]
    gpus: list[dict]  # [{"gpu_uuid", "memory_used", "memory_total"}] in bytes
    disk_free_bytes: int | None
    labels: dict[str, str]
    errors: list[str]
    agent: NotRequired[AgentInfo]
    gateway: NotRequired[GatewayReport | None]  # Triton hosts; None: the agent runs no gateway


class UnsupportedProtocol(Exception):
    """A payload of a protocol newer than this agent's ``PROTOCOL_VERSION``.

    Attributes:
        message: what to upgrade, for the report the agent sends instead of acting.
    """

    def __init__(self, sent: int):
        self.message = (f"this host agent speaks protocol {PROTOCOL_VERSION}, the orchestrator sent protocol "
                        f"{sent}: upgrade the agent on this host (pip install -U ./modelyard_agent from the "
                        "orchestrator's release)")
        super().__init__(self.message)


def check_protocol(payload: dict) -> None:
    """Refuse a payload this agent cannot read without guessing.

    Args:
        payload: any payload of this contract; one without ``protocol`` is protocol 1.

    Raises:
        UnsupportedProtocol: ``payload["protocol"]`` is newer than ``PROTOCOL_VERSION``.
        ValueError: ``protocol`` is not a positive whole number.
    """
    sent = payload.get("protocol", 1)
    if isinstance(sent, bool) or not isinstance(sent, int) or sent < 1:
        raise ValueError(f"protocol must be a positive whole number, got {sent!r}")
    if sent > PROTOCOL_VERSION:
        raise UnsupportedProtocol(sent)
