"""Webhooks: signed notifications of registry events (``version.registered``, ``version.deleted``,
``alias.moved``, ``model.tags_changed``), promotions and rollout outcomes, delivered by Celery with backoff.

A delivery is a POST of a JSON body, ``{"event", "delivery", "sent_at", "data"}``, with headers
``X-Modelyard-Event``, ``X-Modelyard-Timestamp`` (unix seconds) and ``X-Modelyard-Signature:
sha256=<hex>``, the HMAC-SHA256 of ``"<timestamp>.<body>"`` keyed with the webhook's secret. A
receiver recomputes it over the raw body and refuses old timestamps (replays).

The server only calls public addresses: a URL whose host resolves to a loopback, private,
link-local, multicast, reserved or otherwise non-global address is refused when saved and again
before each attempt (DNS may change in between); redirects are not followed.
``settings.WEBHOOK_ALLOW_PRIVATE`` (tests only) lifts that.
"""

import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import time
from urllib.parse import urlsplit

import requests
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.choices import AuditAction
from audit.services import record_audit_event
from deployments.choices import ACTIVE_DEPLOYMENT_STATUSES, DeploymentStatus
from modelyard.errors import InvalidInput, NotFound
from promotions.choices import DeliveryStatus, WebhookEvent
from promotions.enqueue import Job, job
from promotions.models import Webhook, WebhookDelivery

logger = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 300


class UnsafeAddress(Exception):
    """A webhook URL whose host is, or resolves to, an address the server must not call."""


class UnresolvableHost(Exception):
    """A webhook URL's host name does not resolve (now); retrying later may help."""


def _refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    for kind in ("loopback", "private", "link_local", "multicast", "reserved", "unspecified"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    return "" if ip.is_global else "non-public"


def resolve_public_addresses(url: str, *, allow_private: bool | None = None) -> list[str]:
    """Resolve a webhook URL's host and check that every address is public.

    Args:
        url: an ``http://`` or ``https://`` URL.
        allow_private: skip the address check; defaults to ``settings.WEBHOOK_ALLOW_PRIVATE``.

    Returns:
        The resolved IP addresses.

    Raises:
        InvalidInput: not an http(s) URL with a host, or it carries credentials.
        UnresolvableHost: the host does not resolve.
        UnsafeAddress: an address is loopback, private, link-local, multicast, reserved or not global
            (IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry).
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"a webhook URL must be http:// or https:// with a host, got {url!r}")
    if parts.username or parts.password:
        raise InvalidInput("a webhook URL must not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise InvalidInput(f"a webhook URL has a bad port: {url!r}") from exc
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UnresolvableHost(f"{parts.hostname!r} does not resolve") from exc
    addresses = sorted({info[4][0] for info in infos})
    if allow_private if allow_private is not None else settings.WEBHOOK_ALLOW_PRIVATE:
        return addresses
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        kind = _refusal(ip)
        if kind:
            raise UnsafeAddress(f"{parts.hostname!r} resolves to {address}, a {kind} address; "
                                f"webhooks may only call public addresses")
    return addresses


def check_webhook_url(url: str) -> str:
    """Check a webhook URL before it is saved (``resolve_public_addresses``).

    Returns:
        The URL, stripped.

    Raises:
        InvalidInput: malformed, unresolvable, or resolving to an address the server must not call.
    """
    url = (url or "").strip()
    try:
        resolve_public_addresses(url)
    except (UnresolvableHost, UnsafeAddress) as exc:
        raise InvalidInput(str(exc)) from exc
    return url


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The ``X-Modelyard-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of ``"<timestamp>.<body>"``."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def _check_events(events) -> list[str]:
    if events is None:
        return sorted(WebhookEvent.values)
    if not isinstance(events, list) or not events or not all(e in WebhookEvent.values for e in events):
        raise InvalidInput(f"events must be a non-empty list of {', '.join(WebhookEvent.values)}")
    return sorted(set(events))


def check_webhook_scope(model, team) -> None:
    """Refuse a webhook limited to a model of another team than the one it is limited to.

    Raises:
        InvalidInput: ``model`` (a RegisteredModel) is not of ``team`` (an ``accounts.Team``); either may be None.
    """
    if model is not None and team is not None and model.team_id != team.pk:
        raise InvalidInput(f"model {model.name!r} is not a model of team {team.name!r}")


def _described(hook: Webhook) -> dict:
    """What the audit log keeps of a webhook (never its secret)."""
    return {"url": hook.url, "events": list(hook.events), "team": hook.team.name if hook.team_id else None,
            "model": hook.model.name if hook.model_id else None, "enabled": hook.enabled}


def _audit(action: str, hook: Webhook, actor, data: dict) -> None:
    record_audit_event(action=action, actor=actor, obj_type="webhook", obj_id=hook.pk, model=hook.model,
                       data={"url": hook.url, **data})


def create_webhook(*, url: str, events=None, secret: str = "", model=None, team=None,
                   enabled: bool = True, actor=None) -> Webhook:
    """Add a webhook (callers check that the user is an administrator, or an owner of ``team``); audited
    as ``webhook.created``.

    Args:
        url: where to POST; checked by ``check_webhook_url``.
        events: ``WebhookEvent`` values; None for all.
        secret: the HMAC key; a random one (43 characters) when empty.
        model: a RegisteredModel to limit it to, or None for every model.
        team: an ``accounts.Team`` to limit it to (its owners manage it), or None for every team.
        enabled: whether it receives deliveries.
        actor: the requesting user, for the audit log.

    Raises:
        InvalidInput: a bad URL, events, a secret shorter than 16 characters, or a model of another team.
    """
    if secret and len(secret) < 16:
        raise InvalidInput("a webhook secret must be at least 16 characters")
    check_webhook_scope(model, team)
    url, events = check_webhook_url(url), _check_events(events)
    with transaction.atomic():
        hook = Webhook.objects.create(url=url, events=events, secret=secret or secrets.token_urlsafe(32),
                                      model=model, team=team, enabled=enabled)
        _audit(AuditAction.WEBHOOK_CREATED, hook, actor, _described(hook))
    return hook


def _get_webhook(webhook_id: int) -> Webhook:
    hook = Webhook.objects.select_related("model", "team").filter(pk=webhook_id).first()
    if hook is None:
        raise NotFound(f"no webhook {webhook_id}")
    return hook


def update_webhook(webhook_id: int, *, actor=None, **changes) -> Webhook:
    """Change a webhook's ``url``, ``events``, ``secret``, ``model``, ``team`` or ``enabled``; the URL is
    checked again (callers check the user may manage the webhook before and after). Audited as
    ``webhook.changed`` with what changed before and after (a new secret only as changed, never its value).

    Raises:
        NotFound: no such webhook.
        InvalidInput: as ``create_webhook``.
    """
    hook = _get_webhook(webhook_id)
    before = _described(hook)
    if "url" in changes:
        hook.url = check_webhook_url(changes["url"])
    if "events" in changes:
        hook.events = _check_events(changes["events"])
    if changes.get("secret"):
        if len(changes["secret"]) < 16:
            raise InvalidInput("a webhook secret must be at least 16 characters")
        hook.secret = changes["secret"]
    for field in ("model", "team", "enabled"):
        if field in changes:
            setattr(hook, field, changes[field])
    check_webhook_scope(hook.model, hook.team)
    after = _described(hook)
    with transaction.atomic():
        hook.save()
        if after != before or changes.get("secret"):
            _audit(AuditAction.WEBHOOK_CHANGED, hook, actor, {
                "before": before, "after": after, **({"secret": "replaced"} if changes.get("secret") else {})})
    return hook


def delete_webhook(webhook_id: int, *, actor=None) -> None:
    """Delete a webhook and its deliveries (callers check the user may manage it); audited as
    ``webhook.deleted``.

    Raises:
        NotFound: no such webhook.
    """
    hook = _get_webhook(webhook_id)
    with transaction.atomic():
        _audit(AuditAction.WEBHOOK_DELETED, hook, actor, _described(hook))
        hook.delete()


def emit(event: str, *, model, data: dict) -> list[WebhookDelivery]:
    """Queue one delivery of ``event`` to every enabled webhook that wants it; call inside the change's
    transaction: deliveries are sent once it commits.

    Args:
        event: a ``WebhookEvent`` value.
        model: the RegisteredModel concerned (webhooks limited to another model, or to another team,
            are skipped).
        data: JSON details, sent as the body's ``data``.

    Returns:
        The deliveries written.
    """
    hooks = (Webhook.objects.filter(enabled=True).filter(Q(model__isnull=True) | Q(model=model))
             .filter(Q(team__isnull=True) | Q(team_id=model.team_id)))
    deliveries = []
    for hook in hooks:
        if event in hook.events:
            delivery = WebhookDelivery.objects.create(webhook=hook, event=event, payload=data)
            transaction.on_commit(lambda pk=delivery.pk: job(Job.DELIVER_WEBHOOK, pk))
            deliveries.append(delivery)
    return deliveries


def _actor_name(actor) -> str:
    return getattr(actor, "username", "") or "system"


def on_version_registered(sender, *, model, version, actor=None, **kwargs) -> None:
    """Receiver of ``registry.signals.version_registered``: the ``version.registered`` event."""
    emit(WebhookEvent.VERSION_REGISTERED, model=model, data={
        "model": model.name, "version": version.version, "format": version.format,
        "sha256": version.artifact_sha256, "size": version.artifact_size, "source_commit": version.source_commit,
        "actor": _actor_name(actor),
    })


def on_version_deleted(sender, *, model, version, actor=None, **kwargs) -> None:
    """Receiver of ``registry.signals.version_deleted``: the ``version.deleted`` event."""
    emit(WebhookEvent.VERSION_DELETED, model=model, data={
        "model": model.name, "version": version.version, "sha256": version.artifact_sha256,
        "actor": _actor_name(actor),
    })


def on_alias_moved(sender, *, model, alias: str, version, previous=None, reason: str = "", actor=None,
                   **kwargs) -> None:
    """Receiver of ``registry.signals.alias_moved``: the ``alias.moved`` event (``from_version`` is None for
    a new alias)."""
    emit(WebhookEvent.ALIAS_MOVED, model=model, data={
        "model": model.name, "alias": alias, "from_version": previous, "to_version": version.version,
        "reason": reason, "actor": _actor_name(actor),
    })


def on_model_tags_changed(sender, *, model, before: dict, after: dict, actor=None, **kwargs) -> None:
    """Receiver of ``registry.signals.model_tags_changed``: the ``model.tags_changed`` event."""
    emit(WebhookEvent.MODEL_TAGS_CHANGED, model=model, data={
        "model": model.name, "from": before, "to": after, "actor": _actor_name(actor),
    })


def on_rollout_finished(sender, *, deployment, from_status: str, to_status: str, **kwargs) -> None:
    """Receiver of ``deployments.signals.rollout_finished``: tell webhooks a rollout succeeded or failed.

    A rollout that ends FAILED, or ROLLED_BACK before it finished (its failure policy), is a failure;
    rolling back a finished rollout or cancelling one is neither.
    """
    if to_status == DeploymentStatus.SUCCEEDED:
        event = WebhookEvent.ROLLOUT_SUCCEEDED
    elif to_status == DeploymentStatus.FAILED or (
        to_status == DeploymentStatus.ROLLED_BACK and from_status in ACTIVE_DEPLOYMENT_STATUSES
    ):
        event = WebhookEvent.ROLLOUT_FAILED
    else:
        return
    emit(event, model=deployment.model, data={
        "deployment": deployment.pk, "model": deployment.model.name, "version": deployment.version.version,
        "status": to_status, "trigger": deployment.trigger, "follow_alias": deployment.follow_alias,
    })


def on_version_corrupt(sender, *, version, reason: str, **kwargs) -> None:
    """Receiver of ``registry.signals.version_corrupt``: tell webhooks a version's bytes do not match."""
    emit(WebhookEvent.VERSION_CORRUPT, model=version.model, data={
        "model": version.model.name, "version": version.version, "sha256": version.artifact_sha256,
        "reason": reason,
    })


def attempt_delivery(delivery_id: int) -> float | None:
    """Make one attempt at sending a delivery; idempotent once it is DELIVERED or FAILED.

    The host is resolved and checked again first. A 2xx answer delivers it; an unsafe address fails
    it at once; other answers, timeouts (``settings.WEBHOOK_TIMEOUT`` seconds) and unresolvable hosts
    fail the attempt, and after ``settings.WEBHOOK_MAX_ATTEMPTS`` attempts the delivery.

    Returns:
        Seconds to wait before the next attempt (2, 4, 8 … capped at 300), or None when done.
    """
    with transaction.atomic():
        delivery = WebhookDelivery.objects.select_for_update().select_related("webhook").filter(pk=delivery_id).first()
        if delivery is None or delivery.status != DeliveryStatus.PENDING:
            return None
        delivery.attempts += 1
        delivery.save(update_fields=["attempts"])
    hook = delivery.webhook
    status, error, response_status = DeliveryStatus.PENDING, "", None
    try:
        resolve_public_addresses(hook.url)
        timestamp = str(int(time.time()))
        body = json.dumps({"event": delivery.event, "delivery": delivery.pk, "sent_at": int(timestamp),
                           "data": delivery.payload}, sort_keys=True, separators=(",", ":")).encode()
        response = requests.post(hook.url, data=body, timeout=settings.WEBHOOK_TIMEOUT, allow_redirects=False,
                                 headers={"Content-Type": "application/json", "X-Modelyard-Event": delivery.event,
                                          "X-Modelyard-Timestamp": timestamp,
                                          "X-Modelyard-Signature": sign(hook.secret, timestamp, body),
                                          "User-Agent": "modelyard-webhooks"})
        response_status = response.status_code
        if 200 <= response.status_code < 300:
            status = DeliveryStatus.DELIVERED
        else:
            error = f"the receiver answered HTTP {response.status_code}"
    except UnsafeAddress as exc:
        status, error = DeliveryStatus.FAILED, str(exc)
    except (UnresolvableHost, InvalidInput, requests.RequestException) as exc:
        error = str(exc) or type(exc).__name__
    if status == DeliveryStatus.PENDING and delivery.attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
        status = DeliveryStatus.FAILED
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=status, last_error=error[:2000], response_status=response_status,
        delivered_at=timezone.now() if status == DeliveryStatus.DELIVERED else None,
    )
    if status != DeliveryStatus.PENDING:
        if error:
            logger.warning("webhook delivery %s failed: %s", delivery.pk, error)
        return None
    return float(min(MAX_BACKOFF_SECONDS, 2 ** delivery.attempts))
