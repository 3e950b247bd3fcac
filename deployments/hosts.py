"""Serving hosts: register, change and remove them (audited), and look one up.

A host is a runtime (Triton or BentoML) at an inference URL, with its metrics URL, labels that placement
selects on, a production flag, per-host load and unload deadlines and model-config parameters applied to every
model loaded there. No two hosts share an endpoint (``deployments.endpoints``).
"""

import logging

import redis
from django.db import IntegrityError, transaction

from audit.choices import AuditAction
from audit.services import record_audit_event
from deployments.choices import ACTIVE_TARGET_STATES, Runtime
from deployments.endpoints import endpoint_key, normalise_url
from deployments.models import MAX_DEADLINE_SECONDS, ServingHost
from deployments.served import serving_now
from modelyard.celery import broker
from modelyard.errors import Conflict, InvalidInput, NotFound
from modelyard_agent.contract import host_broker_patterns
from modelyard_agent.formats.names import InvalidName, validate_name

logger = logging.getLogger(__name__)


def get_host(name: str) -> ServingHost:
    """Return the serving host called ``name``.

    Raises:
        NotFound: there is none.
    """
    try:
        return ServingHost.objects.get(name=name)
    except ServingHost.DoesNotExist as exc:
        raise NotFound(f"no serving host named {name!r}") from exc


def _check_url(value: str, field: str, *, required: bool) -> str:
    """A host URL, normalised (``deployments.endpoints.normalise_url``); "" when blank and optional."""
    value = (value or "").strip()
    if not value:
        if required:
            raise InvalidInput(f"{field} is required")
        return ""
    return normalise_url(value, field, path_allowed=field == "metrics_url")


def check_host_overrides(overrides) -> dict:
    """A host's ``config_overrides``: ``{"parameters": {str: str}}`` or ``{}`` (the API and the admin).

    Raises:
        InvalidInput: another key, or parameters that are not non-empty strings to strings.
    """
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
    config_overrides=None, labels=None, production: bool = False, load_deadline: int | None = None,
    unload_deadline: int | None = None, actor=None,
) -> ServingHost:
    """Add a serving host to the fleet.

    Args:
        name: host name (same grammar as model names; it names a Celery queue).
        runtime: a ``Runtime`` value.
        inference_url: base HTTP URL of the runtime, e.g. ``http://gpu-0:8000``.
        metrics_url: the runtime's Prometheus metrics URL.
        config_overrides: ``{"parameters": {key: value}}`` applied to every model loaded there.
        labels: string key/value labels.
        production: the host serves production traffic (rollouts there need a team owner).
        load_deadline, unload_deadline: seconds one load or unload may take there (1 to 86400);
            None: the fleet defaults.
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
    if labels is not None:
        check_labels(labels, "labels")
    inference_url = _check_url(inference_url, "inference_url", required=True)
    metrics_url = _check_url(metrics_url, "metrics_url", required=False)
    deadlines = _check_deadlines(load_deadline=load_deadline, unload_deadline=unload_deadline)
    wanted = {endpoint_key(inference_url), endpoint_key(metrics_url)} - {None}
    twin = next((host for host in ServingHost.objects.exclude(name=clean_name).only(
        "name", "inference_url", "metrics_url")
        if wanted & {endpoint_key(host.inference_url), endpoint_key(host.metrics_url)}), None)
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
                config_overrides=check_host_overrides(config_overrides),
                labels=labels or {},
                production=bool(production),
                **deadlines,
            )
            record_audit_event(
                action=AuditAction.HOST_REGISTERED, actor=actor, obj_type="host", obj_id=host.pk,
                data={"name": host.name, "runtime": host.runtime, "inference_url": host.inference_url,
                      "production": host.production},
            )
    except IntegrityError as exc:
        raise Conflict(f"a serving host named {clean_name!r} already exists") from exc
    return host


def _check_deadlines(**deadlines) -> dict:
    """Check per-host deadlines: each an integer number of seconds from 1 to a day, or None.

    Raises:
        InvalidInput: naming the field and the range.
    """

    for field, value in deadlines.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEADLINE_SECONDS:
            raise InvalidInput(f"{field} must be a whole number of seconds from 1 to {MAX_DEADLINE_SECONDS}, "
                               f"or null for the fleet default; got {value!r}")
    return deadlines


def check_labels(labels, field: str) -> dict[str, str]:
    """``labels`` (a host's labels, a deployment's selector) as a dict of strings.

    Raises:
        InvalidInput: not a JSON object of string keys and string values, naming ``field``.
    """
    if not (isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
        raise InvalidInput(f"{field} must be a JSON object of string keys and string values")
    return dict(labels)


_UNSET = object()


def update_host(*, name: str, production: bool | None = None, labels: dict | None = None,
                load_deadline=_UNSET, unload_deadline=_UNSET, actor=None) -> ServingHost:
    """Change a serving host's production flag, labels and/or deadlines (a field left out stays as it
    is); audited with before/after. Endpoints are not changeable: register a new host instead.

    Args:
        name: the host's name.
        production: whether rollouts there need a team owner.
        labels: the new string key/value labels (replacing the old ones).
        load_deadline, unload_deadline: seconds (1 to 86400), or None for the fleet default.
        actor: the requesting user (callers check it is an administrator).

    Returns:
        The updated ServingHost.

    Raises:
        NotFound: no such host.
        InvalidInput: labels are not string key/value pairs, or a deadline is out of range.
    """
    if labels is not None:
        check_labels(labels, "labels")
    given = {key: value for key, value in (("load_deadline", load_deadline), ("unload_deadline", unload_deadline))
             if value is not _UNSET}
    deadlines = _check_deadlines(**given)
    fields = ["production", "labels", "load_deadline", "unload_deadline"]
    with transaction.atomic():
        host = ServingHost.objects.select_for_update().filter(name=name).first()
        if host is None:
            raise NotFound(f"no serving host named {name!r}")
        before = {field: getattr(host, field) for field in fields}
        if production is not None:
            host.production = bool(production)
        if labels is not None:
            host.labels = dict(labels)
        for field, value in deadlines.items():
            setattr(host, field, value)
        after = {field: getattr(host, field) for field in fields}
        if after != before:
            host.save(update_fields=fields)
            record_audit_event(action=AuditAction.HOST_UPDATED, actor=actor, obj_type="host", obj_id=host.pk,
                               data={"name": host.name, "before": before, "after": after})
    return host


def delete_host(*, name: str, actor=None) -> None:
    """Remove a serving host and its deployment targets (the deployments stay, as does the audit log).

    Its agent's queue is no longer served; Prometheus stops scraping it at the next discovery. Once the
    deletion commits, its keys in the broker go too (``forget_in_broker``).

    Raises:
        NotFound: no such host.
        Conflict: a deployment is in progress there, or it serves a model (unload it first, so no
            version is left served by a host the registry no longer knows).
    """
    host = get_host(name)
    with transaction.atomic():
        if host.targets.filter(state__in=ACTIVE_TARGET_STATES).exists():
            raise Conflict(f"a deployment is in progress on {name!r}; wait for it to finish first")
        serving = sorted(t.deployment.model.name for t in serving_now(host=host))
        if serving:
            raise Conflict(f"{name!r} serves {', '.join(serving)}; unload them from it first")
        record_audit_event(action=AuditAction.HOST_DELETED, actor=actor, obj_type="host", obj_id=host.pk,
                           data={"name": host.name, "inference_url": host.inference_url})
        host.delete()
        transaction.on_commit(lambda: forget_in_broker(name))


def forget_in_broker(name: str) -> int:
    """Delete every broker key of host ``name`` (``contract.host_broker_patterns``: its queue and what
    its agent and the orchestrator keep for it), so a host registered later under the same name starts
    clean and nothing of a deleted host stays in Redis. A broker that cannot be reached is logged: the
    keys then stay, and a later deletion of the same name removes them.

    Returns:
        The number of keys deleted.
    """
    try:
        client = broker()
        keys = [key for pattern in host_broker_patterns(name) for key in client.scan_iter(match=pattern, count=500)]
        return client.delete(*keys) if keys else 0
    except redis.RedisError as exc:
        logger.warning("host %s deleted, but its broker keys stay: %s", name, exc)
        return 0
