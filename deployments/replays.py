"""Replays: a model's captured requests sent again to a candidate version and to the version a host serves.

A replay is an agent task (``modelyard_agent.contract.AgentTask.REPLAY``): the host's agent loads the
candidate as a copy of its own, sends each captured request (read from its gateway's capture
directory, newest first) to the serving version and to the copy, paced and one at a time, compares
the answers output by output (``modelyard_agent.replay.compare``) and reports the agreement rate, the
distribution of differences, both sides' latency and the worst disagreements
(``OrchestratorTask.REPLAY_REPORT``, recorded by ``record_replay_report``). One replay runs on a host
at a time. The ``min_agreement`` and ``max_latency_regression`` promotion gates read finished replays
(``promotions.evaluations.evaluate``).

The worst disagreements hold users' data (their inputs' answers): ``may_read_captured`` says who may
read them (owners of the model's team).
"""

from __future__ import annotations

import json
import logging
from functools import partial

from django.db import transaction

from accounts.access import Action, check
from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from deployments import agent_jobs
from deployments.choices import ACTIVE_JOB_STATES, JobStatus, Runtime
from deployments.enqueue import Job, job
from deployments.models import Replay, ServingHost
from modelyard.celery import require_broker
from modelyard.errors import Conflict, InvalidInput, NotFound
from modelyard_agent.contract import REPLAY_PROTOCOL, AgentTask
from modelyard_agent.formats.triton_config import ModelConfigError, parse_model_config
from modelyard_agent.replay.compare import Tolerances
from registry.aliases import resolve_alias
from registry.choices import VersionStatus
from registry.models import ModelVersion
from registry.versions import get_version

logger = logging.getLogger(__name__)

def _report_fields(replay: Replay, report: dict, ended: bool) -> dict:
    """A replay report's own columns: requests done of the total, the summary so far and ``details`` (each
    report carries them whole; one without keeps what the last one said)."""
    return {"done": int(report.get("done") or 0), "total": int(report.get("total") or 0),
            "summary": dict(report.get("summary") or replay.summary or {}),
            "details": dict(report.get("details") or replay.details or {})}


def _payload_fields(replay: Replay) -> dict:
    return {"serving": replay.against.version, "tolerances": replay.tolerances, "max_requests": replay.max_requests,
            "pace": replay.pace, "time_budget_s": replay.time_budget_s}


REPLAY_JOBS = agent_jobs.JobKind(
    name="replay", model=Replay, task=AgentTask.REPLAY, related=("against",), payload=_payload_fields,
    report_fields=_report_fields, cancel_action=AuditAction.REPLAY_CANCELLED,
    budget_fields=("time_budget_s",), budget=lambda replay: float(replay.time_budget_s))

DEFAULT_MAX_REQUESTS = 1000
MAX_REQUESTS_LIMIT = 100_000
DEFAULT_PACE = 20.0  # captured requests per second, each sent to both sides
MAX_PACE = 1000.0
# Seconds added to a replay's time budget beyond its requests at its pace: the copy's staging and load.
BUDGET_ALLOWANCE_SECONDS = 300.0


def check_tolerances(raw: dict | None) -> dict:
    """``raw`` (``{"atol", "rtol", "argmax_outputs"}``, any missing) checked, as stored and sent.

    Raises:
        InvalidInput: a tolerance below 0 or not a number, or argmax outputs that are not a list of names.
    """
    if raw is not None and not isinstance(raw, dict):
        raise InvalidInput("tolerances must be an object with atol, rtol and argmax_outputs")
    unknown = sorted(set(raw or {}) - {"atol", "rtol", "argmax_outputs"})
    if unknown:
        raise InvalidInput(f"unknown tolerance field(s) {', '.join(unknown)}; known: atol, rtol, argmax_outputs")
    try:
        return Tolerances.from_dict(raw).as_dict()
    except ValueError as exc:
        raise InvalidInput(f"tolerances: {exc}") from exc


def _served_versions(host: ServingHost, model: str) -> set[int]:
    return {int(row["version"]) for row in (host.heartbeat or {}).get("models") or []
            if row.get("name") == model and row.get("state") == "READY" and row.get("version") is not None}


def _captured_requests(host: ServingHost, model: str) -> int:
    """The requests the host's gateway last reported captured for ``model`` (0 when none or no report)."""
    gateway = (host.heartbeat or {}).get("gateway") or {}
    entry = (gateway.get("capture") or {}).get(model) or {}
    return int(entry.get("requests") or 0) if gateway.get("live") else 0


def _check_outputs(candidate: ModelVersion, names: list[str]) -> None:
    """Refuse argmax output names the candidate's model config does not declare (a typo would otherwise
    compare those outputs element by element, silently). A version without a parsable config is not checked.

    Raises:
        InvalidInput: naming the unknown outputs and the declared ones.
    """

    if not names or not candidate.config_text:
        return
    try:
        declared = [output.name for output in parse_model_config(candidate.config_text).output]
    except ModelConfigError:
        return
    unknown = sorted(set(names) - set(declared))
    if unknown:
        raise InvalidInput(f"argmax_outputs names output(s) {', '.join(unknown)} that {candidate} does not have; "
                           f"its outputs: {', '.join(declared) or 'none declared'}")


def replay_hosts(against: ModelVersion) -> list[ServingHost]:
    """The Triton hosts that can replay against ``against``: they serve it (READY in their last heartbeat)
    through a live gateway that reported captured requests of the model, most captured first."""
    name = against.model.name
    hosts = [host for host in ServingHost.objects.filter(runtime=Runtime.TRITON).order_by("name")
             if against.version in _served_versions(host, name) and _captured_requests(host, name) > 0]
    return sorted(hosts, key=lambda host: -_captured_requests(host, name))


def _why_not(host: ServingHost, against: ModelVersion) -> str | None:
    """Why ``host`` cannot replay against ``against``, or None."""
    name = against.model.name
    if host.runtime != Runtime.TRITON:
        return f"{host.name!r} is a {host.get_runtime_display()} host; replays run on Triton hosts"
    if not host.last_heartbeat_at:
        return f"the agent of host {host.name!r} never reported"
    protocol = int(((host.heartbeat or {}).get("agent") or {}).get("protocol") or 1)
    if protocol < REPLAY_PROTOCOL:
        return (f"the agent of host {host.name!r} speaks protocol {protocol}; replays need {REPLAY_PROTOCOL}: "
                "upgrade it (pip install -U ./modelyard_agent)")
    if against.version not in _served_versions(host, name):
        return f"{host.name!r} does not serve {name} v{against.version} (READY in its last heartbeat)"
    if _captured_requests(host, name) <= 0:
        return (f"{host.name!r}'s gateway holds no captured requests of {name}: turn the model's request capture "
                "on (modelyard capture set) and let it serve for a while")
    return None


def start_replay(*, model_name: str, version: int, against: str | int, host_name: str | None = None,
                 tolerances: dict | None = None, max_requests: int | None = None, pace: float | None = None,
                 actor=None, authorize=None) -> Replay:
    """Queue a replay of a model's captured requests against candidate ``version``.

    Args:
        model_name, version: the candidate model version (READY in the registry).
        against: the version the captured requests are compared against: a version number, or an alias
            (``production``) naming it.
        host_name: the host to replay on; None: the host serving ``against`` that captured the most
            requests of the model.
        tolerances: ``{"atol", "rtol", "argmax_outputs"}`` (``check_tolerances``); None: the defaults.
        max_requests: captured requests to replay, newest first (1..``MAX_REQUESTS_LIMIT``).
        pace: captured requests per second (above 0, at most ``MAX_PACE``), each sent to both sides, one
            request in flight.
        actor: the requesting user.
        authorize: ``authorize(model_version, hosts)``; raises to refuse (as for a rollout); asked with no
            host first, then with the host chosen.

    Returns:
        The new Replay, QUEUED; it is sent to the host's agent once the transaction commits.

    Raises:
        NotFound: no such model, version, alias or host.
        InvalidInput: bad tolerances, max_requests or pace; a version that is not READY; ``against``
            is the candidate itself.
        Conflict: no host serves ``against`` through a gateway with captured requests of the model (or
            the named one does not, or its agent is older than ``REPLAY_PROTOCOL``), or another replay
            runs on the host.
    """

    candidate = get_version(model_name, version)
    if authorize is not None:
        authorize(candidate, [])  # the rights of a rollout anywhere first; the host's own below
    by_alias = isinstance(against, str) and not (against.isascii() and against.isdigit())  # not '²': int() fails
    against_version = resolve_alias(model_name, against) if by_alias else get_version(model_name, int(against))
    if against_version.pk == candidate.pk:
        raise InvalidInput(f"against names v{candidate.version} itself: replay a candidate against another version")
    if candidate.status != VersionStatus.READY:
        raise InvalidInput(f"{candidate} is {candidate.status}; only a READY version can be replayed")
    checked = check_tolerances(tolerances)
    _check_outputs(candidate, checked["argmax_outputs"])
    count = DEFAULT_MAX_REQUESTS if max_requests is None else max_requests
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_REQUESTS_LIMIT:
        raise InvalidInput(f"max_requests must be a whole number from 1 to {MAX_REQUESTS_LIMIT}; got {count!r}")
    rate = DEFAULT_PACE if pace is None else pace
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= MAX_PACE:
        raise InvalidInput(f"pace must be a number of requests per second above 0 and at most {MAX_PACE:g}; "
                           f"got {rate!r}")
    if host_name:
        host = ServingHost.objects.filter(name=host_name).first()
        if host is None:
            raise NotFound(f"no serving host named {host_name!r}")
        if authorize is not None:
            authorize(candidate, [host])
        if reason := _why_not(host, against_version):
            raise Conflict(reason)
    else:
        hosts = [h for h in replay_hosts(against_version) if _why_not(h, against_version) is None]
        if not hosts:
            serving = [h.name for h in ServingHost.objects.filter(runtime=Runtime.TRITON).order_by("name")
                       if against_version.version in _served_versions(h, model_name)]
            verbs = ("serves", "holds") if len(serving) == 1 else ("serve", "hold")
            hint = (f"{', '.join(serving)} {verbs[0]} it but {verbs[1]} no captured requests "
                    f"of {model_name} (or run an agent older than protocol {REPLAY_PROTOCOL}): turn the model's "
                    "request capture on and let it serve for a while" if serving else
                    "no Triton host serves it now: replay against the version that serves (its production alias)")
            raise Conflict(f"no host can replay against {model_name} v{against_version.version}: {hint}")
        host = hosts[0]
    if authorize is not None:
        authorize(candidate, [host])
    budget = count / rate * 2 + BUDGET_ALLOWANCE_SECONDS + float(host.load_deadline_seconds or 0)
    require_broker("the replay")
    with transaction.atomic():
        agent_jobs.refuse_a_second(REPLAY_JOBS, host)
        replay = Replay.objects.create(version=candidate, against=against_version, host=host, tolerances=checked,
                                       max_requests=count, pace=float(rate), time_budget_s=round(budget, 1),
                                       created_by=acting_user(actor))
        record_audit_event(action=AuditAction.REPLAY_STARTED, actor=actor, obj_type="replay", obj_id=replay.pk,
                           model=candidate.model,
                           data={"version": candidate.version, "against": against_version.version,
                                 "host": host.name, "max_requests": count, "tolerances": checked})
        transaction.on_commit(lambda: job(Job.DISPATCH_REPLAY, replay.pk))
    return replay


# The agent-job operations (``deployments.agent_jobs``: payload, cancel, report, stall) bound to
# replays; the API, the pages, the orchestrator's tasks and the reconciler call these.
build_replay_payload = partial(agent_jobs.build_payload, REPLAY_JOBS)
cancel_replay = partial(agent_jobs.cancel, REPLAY_JOBS)
record_replay_report = partial(agent_jobs.record_report, REPLAY_JOBS)
fail_stalled_replays = partial(agent_jobs.fail_stalled, REPLAY_JOBS)


def latest_replay(candidate: ModelVersion, against: ModelVersion, *, since=None, tolerances: dict | None = None,
                  max_requests: int | None = None, active: bool = False) -> Replay | None:
    """The newest replay of ``candidate`` against ``against``: SUCCEEDED and finished after ``since``, or
    (``active``) queued or running; with ``tolerances`` and ``max_requests`` when given."""
    replays = Replay.objects.filter(version=candidate, against=against).select_related("host")
    if active:
        replays = replays.filter(status__in=ACTIVE_JOB_STATES)
    else:
        replays = replays.filter(status=JobStatus.SUCCEEDED)
        if since is not None:
            replays = replays.filter(finished_at__gte=since)
    if tolerances is not None:
        replays = replays.filter(tolerances=tolerances)
    if max_requests is not None:
        replays = replays.filter(max_requests=max_requests)
    return replays.order_by("-finished_at", "-id").first() if not active else replays.order_by("-id").first()


def may_read_captured(principal, model) -> bool:
    """Whether ``principal`` may read what replays show of captured requests (the worst disagreements: both
    versions' answers to users' inputs): owners of ``model``'s team (``accounts.access.Action.READ_CAPTURED``)."""

    return check(principal, Action.READ_CAPTURED, model=model) is None


def replay_view(replay: Replay, *, may_read: bool) -> dict:
    """What the API and pages show of ``replay``: the summary without the worst disagreements unless
    ``may_read``, and the latency figures.

    Returns:
        ``{"agreement_rate", "compared", "skipped", "differences", "disagreed_outputs",
        "latency_ms": {"serving": {...}, "candidate": {...}}, "latency_regression",
        "latency_regression_text" ("+25.0 %" or None), "worst": list | None}`` (``worst`` None when
        hidden; each row as the agent reported it plus ``serving_json`` and ``candidate_json``, the two
        outputs as compact JSON text for pages).
    """
    summary = replay.summary or {}
    regression = replay.latency_regression
    worst = None
    if may_read:
        worst = [{**row, "serving_json": json.dumps(row.get("serving"), separators=(",", ":")),
                  "candidate_json": json.dumps(row.get("candidate"), separators=(",", ":"))}
                 for row in summary.get("worst") or [] if isinstance(row, dict)]
    return {"agreement_rate": summary.get("agreement_rate"), "compared": summary.get("compared", 0),
            "skipped": summary.get("skipped", 0), "differences": summary.get("differences") or {},
            "disagreed_outputs": summary.get("disagreed_outputs") or {},
            "latency_ms": summary.get("latency_ms") or {}, "latency_regression": regression,
            "latency_regression_text": None if regression is None else f"{regression * 100:+.1f} %",
            "worst": worst}
