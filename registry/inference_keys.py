"""Inference keys: a team's keys that clients present to call the team's models that require one.

A key reads ``myk_<prefix>_<secret>`` and is made as API tokens are (``accounts.tokens.new_plaintext``,
``token_digest``): the row keeps ``prefix`` (not secret) and the hex SHA-256 of the whole key, and the
plaintext is returned once by :func:`create_inference_key`. Who may do what: reading a team's keys needs
a role in the team (``Action.VIEW`` on its models), creating and revoking them and switching a model's
requirement needs its owner (``Action.MANAGE_INFERENCE_KEYS``); callers check, these functions act.

Every change sends ``registry.signals.inference_keys_changed``, on which the deployments app sends each host of
the models concerned the keys its front checks (``deployments.inference_keys``).
"""

import re
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.tokens import new_plaintext, token_digest
from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from modelyard.errors import Conflict, InvalidInput
from registry.models import InferenceKey, RegisteredModel
from registry.registered_models import get_model
from registry.signals import inference_keys_changed

KEY_KIND = "myk"
# What a key looks like (``accounts.tokens.new_plaintext``): a name holding one is refused, so that no key is
# stored or audited as a label.
KEY_RE = re.compile(r"myk_[a-z0-9]{8,16}_[A-Za-z0-9_-]{20,}")
NAME_MAX_LENGTH = InferenceKey._meta.get_field("name").max_length


def _audit(action: str, key: InferenceKey, names: list[str], actor) -> None:
    # Never the key nor its digest: the prefix is enough to tell keys apart.
    record_audit_event(action=action, actor=actor, obj_type="inference_key", obj_id=key.pk, data={
        "name": key.name, "prefix": key.prefix, "team": key.team.name, "models": names,
        "expires_at": key.expires_at.isoformat() if key.expires_at else None,
    })


def create_inference_key(*, name: str, models: list[RegisteredModel], expires_at: datetime | None = None,
                         actor=None) -> tuple[InferenceKey, str]:
    """Make a new inference key for ``models`` and return it with its plaintext, which is not kept.

    Args:
        name: a label of 1 to 100 characters ("checkout-service").
        models: one or more RegisteredModels, all of one team, which owns the key.
        expires_at: an aware datetime in the future, or None for a key that does not expire.
        actor: who asks, for the audit trail and ``created_by``.

    Returns:
        ``(InferenceKey, plaintext)``; show the plaintext once: only its SHA-256 digest is stored.

    Raises:
        InvalidInput: bad name (empty, too long, or holding a key) or expiry, no model, or models of several
            teams (HTTP 400).
        Conflict: no unused prefix could be drawn (HTTP 409; try again).
    """
    name = (name or "").strip()
    if not name or len(name) > NAME_MAX_LENGTH:
        raise InvalidInput(f"an inference key needs a name of 1 to {NAME_MAX_LENGTH} characters")
    if KEY_RE.search(name):
        raise InvalidInput("an inference key's name must not hold a key: name what calls with it")
    models = list({model.pk: model for model in models}.values())
    if not models:
        raise InvalidInput("name at least one model the key opens")
    if len({model.team_id for model in models}) > 1:
        raise InvalidInput("an inference key belongs to one team: name models of one team only")
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise InvalidInput("expires_at needs a time zone")
        if expires_at <= timezone.now():
            raise InvalidInput("expires_at must be in the future")
    names = sorted(model.name for model in models)
    for _attempt in range(5):  # a prefix collision (48 bits) is rare; draw again
        prefix, plaintext = new_plaintext(KEY_KIND)
        try:
            with transaction.atomic():
                key = InferenceKey.objects.create(team_id=models[0].team_id, name=name, prefix=prefix,
                                                  digest=token_digest(plaintext), expires_at=expires_at,
                                                  created_by=acting_user(actor))
                key.scoped_models.set(models)
                _audit(AuditAction.INFERENCE_KEY_CREATED, key, names, actor)
                inference_keys_changed.send(sender=InferenceKey, models=models, actor=actor)
        except IntegrityError:
            continue
        return key, plaintext
    raise Conflict("could not draw an unused inference key prefix; try again")


def revoke_inference_key(key: InferenceKey, actor=None) -> InferenceKey:
    """Revoke ``key`` now; the row stays for the audit trail. Idempotent: a repeat changes nothing and
    writes no audit event.

    Args:
        key: the key to revoke (callers check the actor may manage its team's keys).
        actor: who asks, for the audit trail; None for the system.

    Returns:
        The key, with ``revoked_at`` set (to the first revocation's time on a repeat).
    """
    now = timezone.now()
    with transaction.atomic():
        if InferenceKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=now):
            key.revoked_at = now
            scoped = list(key.scoped_models.all())
            _audit(AuditAction.INFERENCE_KEY_REVOKED, key, sorted(m.name for m in scoped), actor)
            inference_keys_changed.send(sender=InferenceKey, models=scoped, actor=actor)
        else:
            key.refresh_from_db(fields=["revoked_at"])
    return key


def require_inference_key(*, name: str, required: bool, actor=None) -> RegisteredModel:
    """Say whether clients must present an inference key to call model ``name``; audited as a model change
    (``model.updated`` with ``inference_key_required`` from/to). Idempotent: setting what it holds writes nothing.

    Args:
        name: the model's name (callers check the actor may manage the team's keys).
        required: True to require a key of the team scoped to the model, False to open the model again.
        actor: who asks.

    Returns:
        The RegisteredModel as saved.

    Raises:
        NotFound: no such model.
    """
    found = get_model(name)
    with transaction.atomic():
        model = RegisteredModel.objects.select_for_update().get(pk=found.pk)
        if model.inference_key_required != bool(required):
            change = {"from": model.inference_key_required, "to": bool(required)}
            model.inference_key_required = bool(required)
            model.save(update_fields=["inference_key_required", "updated_at"])
            record_audit_event(action=AuditAction.MODEL_UPDATED, actor=actor, obj_type="model", obj_id=model.pk,
                               model=model, data={"inference_key_required": change})
            inference_keys_changed.send(sender=RegisteredModel, models=[model], actor=actor)
    return model
