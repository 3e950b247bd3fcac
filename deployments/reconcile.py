"""The reconciler: compare what each host should serve with what its agent last reported, and repair.

Desired state per (host, model) is the version of the newest deployment target that reached READY
there (with, for an active canary, its stable version beside it: a host that lost either is sent
back to the stable version, and the canary ends rolled back). Observed state is the host's last
heartbeat (Triton's repository index; a version of an on-demand model that is not loaded now reads REGISTERED, which
is no drift: it loads at its next request). Drift, such as a restarted Triton that came back empty or a
version unloaded by hand, is repaired by starting a new deployment of the desired version on that
host, audited with the reconciler as actor; so is a version the runtime holds LOADING or UNLOADING
past the host's deadline (``_repair_stuck_versions``). Deployment targets that no agent picked up
(on a host whose agent never reported, after ``UNREPORTED_HOST_TIMEOUT``; on an offline host, after
``DISPATCH_TIMEOUT``), or whose agent went silent, are failed with a message saying so.

Safe to run at any time and any number of times: it acts only on hosts whose report is newer
than the target it compares against, never while a deployment of that model is in progress
there, and not again for ``RECONCILE_BACKOFF`` seconds after a repair of that (host, model).
"""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from deployments.canaries import resend_routes
from deployments.capture import resend_capture
from deployments.choices import ACTIVE_TARGET_STATES, CanaryState, Residency, RolloutTrigger, TargetState
from deployments.delivery import unsent_targets
from deployments.enqueue import Job, job
from deployments.lifecycle import request_unload
from deployments.models import DeploymentTarget, ServingHost
from deployments.profiles import fail_stalled_profiles
from deployments.replays import fail_stalled_replays
from deployments.rollouts import advance_running_rollouts
from deployments.served import serving_now
from deployments.services import create_rollout
from deployments.targets import record_target_progress
from modelyard.celery import broker
from modelyard_agent.claims import CANCELLED, STARTED, claim_key, claim_target, target_claim
from modelyard_agent.contract import REGISTERED

logger = logging.getLogger(__name__)

# Seconds without a report after which a target whose version the host's heartbeat shows serving, and whose
# agent works on it no more, counts as finished (``finished_unreported``): well past an agent's report in
# flight through the queue.
REPORT_GRACE = 60.0


@dataclass(frozen=True)
class Repair:
    """One action the reconciler took: a redeployment (``deployment_id``) or a failed target."""

    host: str
    model: str
    version: int
    reason: str
    deployment_id: int | None = None


def _desired_and_active(host: ServingHost) -> tuple[dict, set, dict]:
    """Return ({model: the target it serves now (``served.serving_now``)}, {models with an active
    target}, {model: newest target}), each model by the name the host's report uses."""
    desired = {target.runtime_name: target for target in serving_now(host=host)}
    active: set[str] = set()
    newest: dict[str, DeploymentTarget] = {}
    targets = (
        DeploymentTarget.objects.filter(host=host)
        .select_related("deployment__model", "deployment__version")
        .order_by("deployment__created_at", "deployment_id")
    )
    for target in targets:
        newest[target.runtime_name] = target
        if target.state in ACTIVE_TARGET_STATES:
            active.add(target.runtime_name)
    return desired, active, newest


def _canary_stable(target: DeploymentTarget):
    """The stable version (a ModelVersion) beside which ``target``'s version runs as an active canary, or None."""

    deployment = target.deployment
    if deployment.canary_state != CanaryState.ACTIVE or not target.previous_version_id \
            or target.previous_version_id == deployment.version_id:
        return None
    return target.previous_version


def dropped_targets(host_name: str) -> list[tuple[int, datetime]]:
    """The targets of ``host_name`` its agent dropped: dispatched before the agent last started,
    still active, and not among the work its last heartbeat says it carries out.

    A host agent killed mid-deployment (SIGKILL of its whole process group, a reboot) loses its
    work, and its broker message comes back only after the visibility timeout (tens of minutes);
    the restarted agent's heartbeat names its start time and its work (``contract.AgentInfo``),
    which tells such targets apart from those still under way.

    Returns:
        ``[(target id, dispatched_at)]``, oldest dispatch first; empty for a report without the
        agent's start time (an agent older than protocol 2).
    """
    host = ServingHost.objects.filter(name=host_name).only("heartbeat").first()
    agent = ((host.heartbeat or {}).get("agent") or {}) if host else {}
    started = agent.get("started_at")
    if not isinstance(started, int | float):
        return []
    working = {row.get("target_id") for row in agent.get("working_on") or [] if isinstance(row, dict)}
    rows = (DeploymentTarget.objects.filter(host=host, state__in=ACTIVE_TARGET_STATES,
                                            dispatched_at__lt=datetime.fromtimestamp(started, tz=UTC))
            .exclude(pk__in=[pk for pk in working if isinstance(pk, int)])
            .order_by("dispatched_at").values_list("pk", "dispatched_at"))
    return list(rows)


def finished_unreported(host_name: str, *, now=None) -> list[tuple[int, int]]:
    """The targets of ``host_name`` that its agent finished with the version serving, but whose last report
    never reached the orchestrator: the worker holding it died, and the broker hands a message out again only
    after its visibility timeout (40 minutes by default), so the rollout would wait that long.

    A target counts when the host's last heartbeat shows its version READY under the name it serves, the agent
    that sent it took the target (claimed it started, and was started before the dispatch) and works on it no
    more, and no report of it came for ``REPORT_GRACE`` seconds. A target that failed or was refused leaves no
    such trace; the stall timeouts of ``fail_stalled_targets`` still end it.

    Returns:
        ``[(target id, deployment id)]``; empty for a report without the agent's start time.
    """
    now = now or timezone.now()
    host = ServingHost.objects.filter(name=host_name).only("heartbeat").first()
    heartbeat = host.heartbeat if host is not None and isinstance(host.heartbeat, dict) else {}
    agent = heartbeat.get("agent") or {}
    started = agent.get("started_at")
    if not isinstance(started, int | float):
        return []
    working = {row.get("target_id") for row in agent.get("working_on") or [] if isinstance(row, dict)}
    ready = {(row.get("name"), row.get("version")) for row in heartbeat.get("models") or []
             if isinstance(row, dict) and row.get("state") == "READY"}
    quiet = (DeploymentTarget.objects.filter(host=host, state__in=ACTIVE_TARGET_STATES - {TargetState.PENDING},
                                             dispatched_at__gte=datetime.fromtimestamp(started, tz=UTC),
                                             updated_at__lt=now - timedelta(seconds=REPORT_GRACE))
             .exclude(pk__in=[pk for pk in working if isinstance(pk, int)])
             .select_related("deployment__model", "deployment__version"))
    client = broker()
    return [(target.pk, target.deployment_id) for target in quiet
            if (target.runtime_name, target.deployment.version.version) in ready
            and target_claim(client, claim_key(target.pk, target.dispatched_at)) == STARTED]


def reconcile_host(host: ServingHost, *, now=None) -> list[Repair]:
    """Redeploy every model version this host should serve but does not, per its last report.

    Runs under a row lock on the host, so two passes at the same moment (the scheduled one and one
    after a heartbeat, or two orchestrator workers) act once: the second sees the first one's
    deployment as in progress. A model the report shows work under way on (``agent.working_on``)
    is left alone: that report was collected while it changed.

    Returns:
        The repairs started (possibly none).
    """
    now = now or timezone.now()
    with transaction.atomic():
        host = ServingHost.objects.select_for_update().filter(pk=host.pk).first()
        if host is None or not host.is_online(now=now):
            return []
        return _reconcile_locked_host(host, now=now)


def _failed_before_runtime_returned(host: ServingHost, target: DeploymentTarget) -> bool:
    """True when ``target`` failed before the host's runtime last came back (``runtime_back_at``, stamped
    by ``heartbeats.record_heartbeat``): a repair cut short by a runtime that died again says nothing
    about the version, so the back-off does not hold it."""
    back_at = parse_datetime(host.heartbeat.get("runtime_back_at") or "")
    return back_at is not None and target.updated_at < back_at


def _models_at_work(report: dict) -> set[str]:
    """The models a heartbeat report says its agent was working on when it was collected."""
    agent = report.get("agent") or {}
    return {row.get("model") for row in agent.get("working_on") or [] if isinstance(row, dict)}


def _reconcile_locked_host(host: ServingHost, *, now) -> list[Repair]:
    reported = {(m.get("name"), m.get("version")): m.get("state") for m in host.heartbeat.get("models", [])}
    served = {key for key, state in reported.items() if state == "READY"}
    registered = {key for key, state in reported.items() if state == REGISTERED}
    desired, active, newest = _desired_and_active(host)
    busy = active | _models_at_work(host.heartbeat)
    backoff = timedelta(seconds=settings.RECONCILE_BACKOFF)
    repairs = []
    for model, target in sorted(desired.items()):
        version = target.deployment.version.version
        stable = _canary_stable(target)
        if target.deployment.residency == Residency.ON_DEMAND:
            served = served | {key for key in registered if key[0] == model}  # loaded at its next request
        if (model, version) in served and (stable is None or (model, stable.version) in served) or model in busy:
            continue
        if host.last_heartbeat_at <= target.updated_at:
            continue  # the report predates the deployment it would be compared with
        latest = newest[model]
        retried = latest.pk != target.pk and latest.deployment.version_id == target.deployment.version_id
        if retried and latest.state == TargetState.FAILED and now - latest.updated_at < backoff \
                and not _failed_before_runtime_returned(host, latest):
            continue  # redeploying this very version failed recently: do not loop
        if stable is not None:
            # A canary that lost a version (a restarted Triton) falls back to the stable version: the
            # canary has not passed its gates, and a new one can be started.
            lost = version if (model, version) not in served else stable.version
            reason = (f"{host.name} reported {model} version {lost} {reported.get((model, lost)) or 'missing'} "
                      f"under the canary of rollout {target.deployment_id}; back to the stable v{stable.version}")
        else:
            state = reported.get((model, version))
            reason = (f"{host.name} reported {model} version {version} {state}" if state
                      else f"{host.name} reported {model} version {version} missing")
        deployment = create_rollout(
            model_version=stable or target.deployment.version, hosts=[host],
            config_overrides=target.deployment.config_overrides, autoscale=target.deployment.autoscale,
            max_request_bytes=target.deployment.max_request_bytes, **target.deployment.residency_settings(),
            trigger=RolloutTrigger.RECONCILER, reason=reason,
        )
        logger.warning("reconcile: %s; redeploying (deployment %s)", reason, deployment.pk)
        repairs.append(Repair(host=host.name, model=model, version=version, reason=reason,
                              deployment_id=deployment.pk))
    repairs.extend(_repair_stuck_versions(host, desired, active, now=now))
    return repairs


def _repair_stuck_versions(host: ServingHost, desired: dict, active: set, *, now) -> list[Repair]:
    """Ask the host to return each model it holds LOADING or UNLOADING past its deadline to the
    desired state: a redeployment of the version that should serve (loaded with only that version,
    so the stuck one goes), or an unload when none should.

    Triton applies such a request when the load in its way ends; one that never ends (a python stub
    that died while starting, triton-inference-server #8766) needs a restart of Triton, which the
    host page says. Once per ``RECONCILE_BACKOFF`` seconds per (host, model), and never while a
    rollout of the model is in progress there.
    """

    repairs = []
    for stuck in host.stuck_versions(now=now):
        model = stuck["name"]
        if model in active or not _first_repair_in_backoff(host.name, model):
            continue
        reason = (f"{host.name} reported {model} version {stuck['version']} {stuck['state']} for "
                  f"{stuck['seconds']} s, past its deadline of {stuck['deadline']} s")
        target = desired.get(model)
        if target is None:
            if request_unload(host, model, reason=reason):
                logger.warning("reconcile: %s; unloading %s there", reason, model)
                repairs.append(Repair(host=host.name, model=model, version=stuck["version"], reason=reason))
            continue
        deployment = create_rollout(
            model_version=target.deployment.version, hosts=[host],
            config_overrides=target.deployment.config_overrides, autoscale=target.deployment.autoscale,
            max_request_bytes=target.deployment.max_request_bytes, **target.deployment.residency_settings(),
            trigger=RolloutTrigger.RECONCILER, reason=reason,
        )
        logger.warning("reconcile: %s; redeploying version %s (deployment %s)", reason,
                       target.deployment.version.version, deployment.pk)
        repairs.append(Repair(host=host.name, model=model, version=target.deployment.version.version,
                              reason=reason, deployment_id=deployment.pk))
    return repairs


def _first_repair_in_backoff(host: str, model: str) -> bool:
    """True once per ``RECONCILE_BACKOFF`` seconds for a (host, model): a key set in the broker's Redis
    with that expiry, so every orchestrator worker shares it."""

    return bool(broker().set(f"modelyard:repair-stuck:{host}:{model}", "1", nx=True,
                           ex=max(1, int(settings.RECONCILE_BACKOFF))))


def fail_stalled_targets(*, now=None) -> list[Repair]:
    """Fail deployment targets that no agent is working on, each with a message that says why.

    - pending longer than ``UNREPORTED_HOST_TIMEOUT`` seconds on a host whose agent has never
      reported: nothing consumes its queue, and nothing says anything ever will;
    - pending longer than ``DISPATCH_TIMEOUT`` seconds on a host that is not online: nobody
      consumes its queue now;
    - staging or loading with no report for ``AGENT_LOAD_TIMEOUT + DISPATCH_TIMEOUT`` seconds:
      the agent's task was lost.

    A pending target is first claimed as cancelled in the broker (``modelyard_agent.claims``), so an
    agent that comes up later and finds its task touches nothing on its host; one the agent claimed
    first is under way and is left alone.

    Returns:
        One Repair per target failed.
    """
    now = now or timezone.now()
    repairs = []
    pending_cutoff = now - timedelta(seconds=settings.DISPATCH_TIMEOUT)
    unreported_cutoff = now - timedelta(seconds=settings.UNREPORTED_HOST_TIMEOUT)
    silent_cutoff = now - timedelta(seconds=settings.AGENT_LOAD_TIMEOUT + settings.DISPATCH_TIMEOUT)
    # A pending target of a later batch waits for its turn; only a dispatched one can stall.
    stalled = DeploymentTarget.objects.filter(
        state__in=ACTIVE_TARGET_STATES, dispatched_at__isnull=False
    ).select_related("host", "deployment__model", "deployment__version")
    for target in stalled:
        host = target.host
        if target.state == TargetState.PENDING:
            if host.last_heartbeat_at is None and target.dispatched_at < unreported_cutoff:
                message = (f"the agent of {host.name} has never reported, and nothing took this up within "
                           f"{settings.UNREPORTED_HOST_TIMEOUT:g} s: start modelyard-agent --host {host.name} "
                           f"there (it consumes Celery queue {host.queue}), then roll out again")
            elif target.dispatched_at < pending_cutoff and not host.is_online(now=now):
                message = (f"no host agent picked this up within {settings.DISPATCH_TIMEOUT:g} s: is the agent of "
                           f"{host.name} running (Celery queue {host.queue})?")
            else:
                continue
            if not _claimed_for_failing(target):
                continue
        elif target.updated_at < silent_cutoff:
            message = f"the host agent of {host.name} stopped reporting while {target.state}"
        else:
            continue
        record_target_progress(target.pk, TargetState.FAILED, message=message)
        repairs.append(Repair(host=host.name, model=target.deployment.model.name,
                              version=target.deployment.version.version, reason=message))
    return repairs


def _claimed_for_failing(target: DeploymentTarget) -> bool:
    """Claim a dispatched pending target as cancelled so its agent never acts on it; False when the
    agent claimed it first (it has started: its reports will say how it goes)."""

    return claim_target(broker(), claim_key(target.pk, target.dispatched_at), CANCELLED) == CANCELLED


def reconcile_fleet() -> list[Repair]:
    """Fail stalled targets, profiles and replays, send again the targets whose send was lost
    (``delivery.unsent_targets``), advance running rollouts, send again canary routes a gateway does
    not hold (``canaries.resend_routes``) and capture settings it does not hold (``capture.resend_capture``),
    then reconcile every host. Returns the repairs (profiles failed
    and routes sent are logged, not counted)."""

    for profile_id in fail_stalled_profiles():
        logger.warning("profile %s failed: its host's agent stopped reporting", profile_id)
    for replay_id in fail_stalled_replays():
        logger.warning("replay %s failed: its host's agent stopped reporting", replay_id)
    repairs = fail_stalled_targets()
    for target_id, dispatched_at in unsent_targets():
        logger.warning("reconcile: target %s was dispatched at %s and never reached its agent; sending it again",
                       target_id, dispatched_at.isoformat())
        job(Job.RESEND_TARGET, target_id, dispatched_at.isoformat())
    advance_running_rollouts()
    for host, model in resend_routes():
        logger.warning("reconcile: %s's gateway reported another route for %s than its canary's; sent it again",
                       host, model)
    for host, model in resend_capture():
        logger.warning("reconcile: %s's gateway reported other capture settings for %s than the registry's; "
                       "sent them again", host, model)
    for host in ServingHost.objects.order_by("name"):
        repairs.extend(reconcile_host(host))
    return repairs
