"""Fleet operations: register serving hosts, start deployments, record host progress.

The web process only writes desired state and enqueues work on commit; the
orchestrator task ``dispatch_target`` hands each host agent what it needs, and
the agent's reports come back through ``record_target_progress``.
"""

import logging
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from deployments.choices import ACTIVE_TARGET_STATES, TARGET_TRANSITIONS, Runtime, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost, TargetEvent
from modelyard.errors import Conflict, InvalidInput, NotFound
from registry.choices import AuditAction, VersionStatus
from registry.models import ModelVersion
from registry.names import InvalidName, validate_name
from registry.services import acting_user, get_version, record_audit_event

logger = logging.getLogger(__name__)


class IllegalTransition(Exception):
    """A target state change that the state machine does not allow."""


def _check_url(value: str, field: str, *, required: bool) -> str:
    value = (value or "").strip()
    if not value:
        if required:
            raise InvalidInput(f"{field} is required")
        return ""
    parts = urlsplit(value)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise InvalidInput(f"{field} must be an http:// or https:// URL with a host, got {value!r}")
    if parts.username or parts.password:
        raise InvalidInput(f"{field} must not carry credentials")
    return value.rstrip("/")


def _check_overrides(overrides) -> dict:
    if overrides in (None, ""):
        return {}
    if not isinstance(overrides, dict):
        raise InvalidInput("config_overrides must be a JSON object")
    unknown = set(overrides) - {"parameters"}
    if unknown:
        raise InvalidInput(f"config_overrides supports only 'parameters'; unknown keys: {sorted(unknown)}")
    parameters = overrides.get("parameters", {})
    if not isinstance(parameters, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in parameters.items()
    ):
        raise InvalidInput("config_overrides.parameters must map non-empty string keys to string values")
    return {"parameters": dict(parameters)} if parameters else {}


def register_host(
    *, name: str, runtime: str = Runtime.TRITON, inference_url: str, metrics_url: str = "",
    config_overrides=None, labels=None, actor=None,
) -> ServingHost:
    """Add a serving host to the fleet.

    Args:
        name: host name (same grammar as model names; it names a Celery queue).
        runtime: a ``Runtime`` value.
        inference_url: base HTTP URL of the runtime, e.g. ``http://gpu-0:8000``.
        metrics_url: the runtime's Prometheus metrics URL.
        config_overrides: ``{"parameters": {key: value}}`` applied to every model loaded there.
        labels: string key/value labels.
        actor: the requesting user.

    Returns:
        The new ServingHost.

    Raises:
        InvalidInput: a field is invalid.
        Conflict: a host with that name, inference URL or metrics URL exists.
    """
    try:
        clean_name = validate_name(name, kind="host name")
    except InvalidName as exc:
        raise InvalidInput(str(exc)) from exc
    if runtime not in Runtime.values:
        raise InvalidInput(f"runtime must be one of {', '.join(Runtime.values)}, got {runtime!r}")
    if labels is not None and not (
        isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        raise InvalidInput("labels must be a JSON object of string keys and string values")
    inference_url = _check_url(inference_url, "inference_url", required=True)
    metrics_url = _check_url(metrics_url, "metrics_url", required=False)
    same = Q(inference_url=inference_url) | (Q(metrics_url=metrics_url) if metrics_url else Q(pk__in=[]))
    twin = ServingHost.objects.filter(same).exclude(name=clean_name).first()
    if twin is not None:
        # Two hosts on one endpoint would be scraped twice and double every metric.
        raise Conflict(f"serving host {twin.name!r} already uses that inference or metrics URL")
    try:
        with transaction.atomic():
            host = ServingHost.objects.create(
                name=clean_name,
                runtime=runtime,
                inference_url=inference_url,
                metrics_url=metrics_url,
                config_overrides=_check_overrides(config_overrides),
                labels=labels or {},
            )
            record_audit_event(
                action=AuditAction.HOST_REGISTERED, actor=actor, obj_type="host", obj_id=host.pk,
                data={"name": host.name, "runtime": host.runtime, "inference_url": host.inference_url},
            )
    except IntegrityError as exc:
        raise Conflict(f"a serving host named {clean_name!r} already exists") from exc
    return host


def start_deployment(*, model_name: str, version: int, host_names: list[str], actor=None) -> Deployment:
    """Ask the given hosts to serve one model version.

    Writes the deployment and one pending target per host, then, once the
    transaction commits, enqueues ``dispatch_target`` for each target.

    Args:
        model_name: registered model name.
        version: its version number.
        host_names: names of registered serving hosts (at least one, no repeats).
        actor: the requesting user.

    Returns:
        The new Deployment.

    Raises:
        NotFound: the model or version does not exist.
        InvalidInput: no hosts, a repeated host, or an unknown host.
    """
    from deployments.tasks import dispatch_target

    model_version = get_version(model_name, version)
    if not host_names:
        raise InvalidInput("hosts must name at least one serving host")
    if len(set(host_names)) != len(host_names):
        raise InvalidInput("hosts must not repeat a host")
    hosts = {h.name: h for h in ServingHost.objects.filter(name__in=host_names)}
    unknown = [name for name in host_names if name not in hosts]
    if unknown:
        raise InvalidInput(f"unknown serving host(s): {', '.join(map(repr, unknown))}")
    with transaction.atomic():
        # delete_version locks the same row: a version deleted since get_version is not deployed.
        live = ModelVersion.objects.select_for_update().filter(pk=model_version.pk)
        if not live.exclude(status=VersionStatus.DELETED).exists():
            raise NotFound(f"model {model_name!r} has no version {version}")
        deployment = Deployment.objects.create(
            model=model_version.model, version=model_version, created_by=acting_user(actor)
        )
        targets = [DeploymentTarget.objects.create(deployment=deployment, host=hosts[n]) for n in host_names]
        record_audit_event(
            action=AuditAction.DEPLOYMENT_CREATED, actor=actor, obj_type="deployment", obj_id=deployment.pk,
            model=model_version.model, data={"version": version, "hosts": host_names},
        )
        for target in targets:
            transaction.on_commit(lambda pk=target.pk: dispatch_target.delay(pk))
    return deployment


def delete_host(*, name: str, actor=None) -> None:
    """Remove a serving host and its deployment targets (the deployments stay, as does the audit log).

    Its agent's queue is no longer served; Prometheus stops scraping it at the next discovery.

    Raises:
        NotFound: no such host.
        Conflict: a deployment is in progress there.
    """
    host = get_host(name)
    with transaction.atomic():
        if host.targets.filter(state__in=ACTIVE_TARGET_STATES).exists():
            raise Conflict(f"a deployment is in progress on {name!r}; wait for it to finish first")
        record_audit_event(action=AuditAction.HOST_DELETED, actor=actor, obj_type="host", obj_id=host.pk,
                           data={"name": host.name, "inference_url": host.inference_url})
        host.delete()


def ready_targets_oldest_first(**filters):
    """READY deployment targets, oldest deployment first.

    Folded into a dict keyed by (host, model), the last target written is the version the
    host serves now: the newest deployment that reached READY there wins. ``filters`` narrow
    the queryset (e.g. ``host=...``).
    """
    return DeploymentTarget.objects.filter(state=TargetState.READY, **filters).order_by(
        "deployment__created_at", "deployment_id"
    )


def get_host(name: str) -> ServingHost:
    """Return the serving host called ``name``.

    Raises:
        NotFound: there is none.
    """
    try:
        return ServingHost.objects.get(name=name)
    except ServingHost.DoesNotExist as exc:
        raise NotFound(f"no serving host named {name!r}") from exc


def get_deployment(pk: int) -> Deployment:
    """Return deployment ``pk`` with its targets and hosts prefetched.

    Raises:
        NotFound: there is none.
    """
    try:
        return (
            Deployment.objects.select_related("model", "version")
            .prefetch_related("targets__host")
            .get(pk=pk)
        )
    except Deployment.DoesNotExist as exc:
        raise NotFound(f"no deployment {pk}") from exc


def transition(target_id: int, to_state: str, *, message: str = "", details: dict | None = None) -> bool:
    """Move a deployment target to ``to_state`` with a compare-and-set update.

    Args:
        target_id: the DeploymentTarget's primary key.
        to_state: a ``TargetState`` value.
        message: the error (for FAILED) or a note, kept on the event row.
        details: merged into the target's ``details``.

    Returns:
        True when the state changed, False when the target was already in
        ``to_state`` (a repeat is a no-op).

    Raises:
        IllegalTransition: the move is not in ``TARGET_TRANSITIONS`` (for
            example a late progress report for a finished target).
        NotFound: no such target.
    """
    with transaction.atomic():
        try:
            target = DeploymentTarget.objects.select_for_update().get(pk=target_id)
        except DeploymentTarget.DoesNotExist as exc:
            raise NotFound(f"no deployment target {target_id}") from exc
        if target.state == to_state:
            return False
        if to_state not in TARGET_TRANSITIONS[target.state]:
            raise IllegalTransition(f"target {target_id}: {target.state} -> {to_state} is not allowed")
        changed = DeploymentTarget.objects.filter(pk=target_id, state=target.state).update(
            state=to_state,
            error=message if to_state == TargetState.FAILED else target.error,
            details={**target.details, **(details or {})},
            updated_at=timezone.now(),
        )
        if changed:
            TargetEvent.objects.create(target=target, from_state=target.state, to_state=to_state, message=message)
        return bool(changed)


def record_target_progress(target_id: int, state: str, *, message: str = "", details: dict | None = None) -> None:
    """Record a host agent's report for a target; stale or repeated reports are ignored.

    Args:
        target_id: the DeploymentTarget's primary key.
        state: the ``TargetState`` the agent reached.
        message: Triton's or the agent's error text for FAILED.
        details: what the agent measured (durations in seconds, replaced versions).
    """
    try:
        transition(target_id, state, message=message, details=details)
    except IllegalTransition as exc:
        logger.info("ignoring stale progress report: %s", exc)


def build_agent_payload(target: DeploymentTarget, *, download_url: str) -> dict:
    """Return the JSON payload a host agent needs to carry out one target.

    The agent gets no database or S3 credentials: it receives a presigned
    download URL, the artifact's sha256 and size (bytes), the uploaded
    config.pbtxt text and the host's config overrides.
    """
    version: ModelVersion = target.deployment.version
    return {
        "target_id": target.pk,
        "host": target.host.name,
        "model": version.model.name,
        "version": version.version,
        "artifact_url": download_url,
        "sha256": version.artifact_sha256,
        "size": version.artifact_size,
        "config_text": version.config_text,
        "parameters": dict(target.host.config_overrides.get("parameters", {})),
        "inference_url": target.host.inference_url,
        "metrics_url": target.host.metrics_url,
    }



def record_heartbeat(host_name: str, report: dict) -> bool:
    """Store what a host agent reported (see ``agent.collect_heartbeat``) with the time it arrived.

    Returns:
        False when the host is unknown (deleted since the request went out), else True.
    """
    if not isinstance(report, dict):
        raise InvalidInput("a heartbeat report is a JSON object")
    return bool(
        ServingHost.objects.filter(name=host_name).update(last_heartbeat_at=timezone.now(), heartbeat=report)
    )
