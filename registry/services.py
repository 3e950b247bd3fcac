"""Registry operations: create models, register versions.

Each function takes explicit arguments, runs in one transaction where it
writes, and raises ``modelyard.errors`` exceptions that views map to HTTP.
"""

import logging
from contextlib import ExitStack
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.access import Action, Principal, can_see, check, require
from accounts.services import default_team
from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from modelyard.errors import Conflict, Forbidden, InvalidInput, NotFound, ServiceUnavailable
from modelyard_agent.formats.archives import sha256_file
from modelyard_agent.formats.names import RESERVED_ALIASES, InvalidName, validate_alias, validate_name
from modelyard_agent.formats.triton_config import ModelConfigError, sample_arrays
from registry.choices import ArtifactFormat, VersionStatus
from registry.formats import PreparedArtifact, prepare_artifact
from registry.formats.triton import resolve_ensemble_members
from registry.locks import artifact_in_use
from registry.models import Alias, EnsembleMember, ModelVersion, RegisteredModel
from registry.signals import (
    alias_moved,
    model_tags_changed,
    version_deleted,
    version_deletion_check,
    version_registered,
)
from registry.storage import ArtifactStore, StorageError, artifact_key

logger = logging.getLogger(__name__)


def _validate_tags(tags) -> dict[str, str]:
    if tags is None:
        return {}
    if not isinstance(tags, dict):
        raise InvalidInput("tags must be a JSON object of string keys and string values")
    for key, value in tags.items():
        if not isinstance(key, str) or not key.strip() or len(key) > 128:
            raise InvalidInput(f"tag key {key!r} must be a non-empty string of at most 128 characters")
        if "=" in key:  # searches read ?tag=key=value: a key with '=' could never be found
            raise InvalidInput(f"tag key {key!r} must not contain '='")
        if not isinstance(value, str) or len(value) > 1024:
            raise InvalidInput(f"tag {key!r} must have a string value of at most 1024 characters")
    return dict(tags)


def create_model(*, name: str, description: str = "", tags=None, team=None, actor=None) -> RegisteredModel:
    """Register a new model name.

    Args:
        name: the model name; normalised and checked against ``modelyard_agent.formats.names``.
        team: the owning ``accounts.Team`` (callers check the actor may create models there);
            None for the default team.
        description: free text.
        tags: a dict of string keys to string values.
        actor: the requesting user.

    Returns:
        The new RegisteredModel.

    Raises:
        InvalidInput: the name or tags are invalid.
        Conflict: a model with that name exists.
    """
    try:
        clean_name = validate_name(name)
    except InvalidName as exc:
        raise InvalidInput(str(exc)) from exc
    clean_tags = _validate_tags(tags)
    try:
        with transaction.atomic():
            model = RegisteredModel.objects.create(
                name=clean_name, description=description or "", tags=clean_tags, created_by=acting_user(actor),
                team=team or default_team(),
            )
            record_audit_event(
                action=AuditAction.MODEL_CREATED, actor=actor, obj_type="model", obj_id=model.pk, model=model,
                data={"name": model.name, "team": model.team.name},
            )
    except IntegrityError as exc:
        raise Conflict(f"a model named {clean_name!r} already exists") from exc
    return model


def update_model(*, name: str, description: str | None = None, tags=None, actor=None) -> RegisteredModel:
    """Change a model's description and/or tags (``None`` leaves a field as it is); audited with before/after.

    Raises:
        NotFound: no such model.
        InvalidInput: invalid tags.
    """
    model = get_model(name)
    changes = {}
    if description is not None and description != model.description:
        changes["description"] = {"from": model.description, "to": description}
        model.description = description
    if tags is not None:
        clean = _validate_tags(tags)
        if clean != model.tags:
            changes["tags"] = {"from": model.tags, "to": clean}
            model.tags = clean
    if changes:
        with transaction.atomic():
            model.save(update_fields=["description", "tags", "updated_at"])
            record_audit_event(action=AuditAction.MODEL_UPDATED, actor=actor, obj_type="model", obj_id=model.pk,
                               model=model, data=changes)
            if "tags" in changes:
                model_tags_changed.send(sender=RegisteredModel, model=model, before=changes["tags"]["from"],
                                        after=changes["tags"]["to"], actor=actor)
    return model


def get_model(name: str, *, visible_to=None) -> RegisteredModel:
    """Return the model called ``name``.

    Args:
        name: the model's name.
        visible_to: an ``accounts.access.Principal``; when given, a model of a team it cannot
            read is reported exactly as a missing one, so names do not leak across teams.

    Raises:
        NotFound: there is none (or none the principal may read).
    """
    model = RegisteredModel.objects.select_related("team").filter(name=name).first()
    if model is None or (visible_to is not None and not can_see(visible_to, model)):
        raise NotFound(f"no model named {name!r}")
    return model


def get_version(model_name: str, version: int, *, visible_to=None) -> ModelVersion:
    """Return version number ``version`` of model ``model_name`` (not deleted).

    Args:
        visible_to: as for :func:`get_model`.

    Raises:
        NotFound: the model or the version does not exist (or the principal may not read the model).
    """
    model = get_model(model_name, visible_to=visible_to)
    try:
        return model.versions.exclude(status=VersionStatus.DELETED).get(version=version)
    except ModelVersion.DoesNotExist as exc:
        raise NotFound(f"model {model_name!r} has no version {version}") from exc


def _check_lineage(lineage: dict | None) -> dict:
    """Validate lineage fields: source_commit (hex, ≤64), ci_run_url (http(s)), training_data_uri, metrics."""
    lineage = dict(lineage or {})
    unknown = set(lineage) - {"source_commit", "ci_run_url", "training_data_uri", "metrics"}
    if unknown:
        raise InvalidInput(f"unknown lineage fields: {sorted(unknown)}")
    commit = (lineage.get("source_commit") or "").strip()
    if commit and not (len(commit) <= 64 and all(c in "0123456789abcdefABCDEF" for c in commit)):
        raise InvalidInput("source_commit must be a hexadecimal commit id of at most 64 characters")
    url = (lineage.get("ci_run_url") or "").strip()
    if url and not url.startswith(("http://", "https://")):
        raise InvalidInput("ci_run_url must be an http:// or https:// URL")
    metrics = lineage.get("metrics") or {}
    if not isinstance(metrics, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) for k, v in metrics.items()
    ):
        raise InvalidInput("metrics must be a JSON object of names to numbers, e.g. {\"accuracy\": 0.97}")
    return {"source_commit": commit.lower(), "ci_run_url": url[:500],
            "training_data_uri": (lineage.get("training_data_uri") or "").strip()[:500], "metrics": metrics}


def register_version(
    *, model: RegisteredModel, artifact_path: Path | None = None, filename: str = "", metadata=None, actor=None,
    store: ArtifactStore | None = None, tags=None, lineage: dict | None = None,
    signature=None, max_batch_size: int | None = None, staged_key: str | None = None, sha256: str | None = None,
    prepared: PreparedArtifact | None = None, size: int | None = None, sha256_verified: bool = True,
) -> ModelVersion:
    """Validate an uploaded artifact, store it in S3 and register it as the next version.

    The artifact is any kind ``registry.formats`` accepts: a Triton model
    directory or ensemble archive, an ONNX/TorchScript/TensorRT plan file
    (stored wrapped in a Triton model directory with a generated config.pbtxt),
    or a BentoML model or Bento. Nothing is written to the database until the
    object is stored under its content address and verified, so a failure
    leaves no version row; the version number is allocated under a row lock on
    the model, so concurrent registrations get distinct consecutive numbers.
    An ensemble's members are checked before anything is stored and again,
    locked, when its rows are written.

    Args:
        model: the registered model.
        artifact_path: the uploaded file on local disk.
        filename: the name the client gave the file; its suffix tells the kind
            (kept for display).
        signature: inputs and outputs of a single-file model (see
            ``registry.formats.prepare_artifact``); required for .pt and .plan.
        max_batch_size: for single-file models: 0 (default) or the batch limit.
        metadata: a JSON object of free-form metadata.
        tags: string key/value tags of the version.
        lineage: ``source_commit``, ``ci_run_url``, ``training_data_uri`` and ``metrics``
            (names to numbers), shown on the version page and searchable.
        actor: the requesting user.
        store: the artifact store; defaults to one built from settings.
        staged_key: an object in the bucket holding the same bytes as ``artifact_path`` (a
            verified multipart upload); it then becomes the artifact (see ``put_artifact``).
        sha256: the hex digest of ``artifact_path`` when the caller computed it while receiving
            the bytes (a multipart upload read back from S3); saves hashing the file again.
        prepared: instead of ``artifact_path``, an upload already checked where it is stored
            (``registry.formats.prepare_stored_archive``); ``staged_key``, ``sha256`` and
            ``size`` (bytes) must come with it.
        sha256_verified: False when ``sha256`` is the client's claim that the server has not
            checked against the stored bytes yet (``ModelVersion.sha256_verified_at`` stays None
            until ``verify_version_bytes`` has).

    Returns:
        The new ModelVersion, status READY.

    Raises:
        InvalidInput: the artifact is not a valid, safe artifact of an accepted
            kind (its config does not parse, its tag or config names another
            model, an ensemble member is not registered, a signature is missing
            or wrong), or metadata is not an object.
        ServiceUnavailable: S3 cannot be reached or failed to store the object.
    """
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise InvalidInput("metadata must be a JSON object")
    clean_tags = _validate_tags(tags)
    clean_lineage = _check_lineage(lineage)
    if prepared is not None and not (staged_key and sha256 and size):
        raise ValueError("a prepared stored artifact needs its staged_key, sha256 and size")
    if prepared is None:
        size = artifact_path.stat().st_size
    if size == 0:
        raise InvalidInput("the artifact is empty")
    if size > settings.MAX_ARTIFACT_BYTES:
        raise InvalidInput(f"the artifact is {size} bytes; the limit is {settings.MAX_ARTIFACT_BYTES} bytes")
    with ExitStack() as stack:
        prepared = stack.enter_context(prepared or prepare_artifact(
            artifact_path, filename=filename, model_name=model.name, signature=signature, max_batch_size=max_batch_size
        ))
        resolve_ensemble_members(prepared.ensemble_members, team_id=model.team_id)
        _check_sample_input(metadata.get("sample_input"), prepared)
        if sha256 and prepared.is_original:
            size = size if prepared.path is None else prepared.path.stat().st_size
        else:
            sha256, size = sha256_file(prepared.path)
        store = store or ArtifactStore()
        # Until the row commits nothing references the object: keep the garbage collector off it.
        stack.enter_context(artifact_in_use(artifact_key(sha256)))
        try:
            stored = store.put_artifact(
                prepared.path, sha256=sha256, size=size, staged_key=staged_key if prepared.is_original else None
            )
        except StorageError as exc:
            raise ServiceUnavailable(f"the artifact could not be stored: {exc.message}") from exc
        with transaction.atomic():
            locked = RegisteredModel.objects.select_for_update().get(pk=model.pk)
            # Locked until commit, so a member cannot be deleted between this check and the rows below.
            members = resolve_ensemble_members(prepared.ensemble_members, team_id=model.team_id, lock=True)
            number = locked.next_version
            locked.next_version = number + 1
            locked.save(update_fields=["next_version", "updated_at"])
            version = ModelVersion.objects.create(
                model=locked,
                version=number,
                status=VersionStatus.READY,
                format=prepared.format,
                artifact_key=stored.key,
                artifact_sha256=sha256,
                artifact_size=size,
                artifact_filename=filename[:255],
                sha256_verified_at=timezone.now() if sha256_verified else None,
                config_text=prepared.config_text,
                artifact_files=list(prepared.files),
                signature=prepared.signature,
                metadata=metadata,
                tags=clean_tags,
                **clean_lineage,
                created_by=acting_user(actor),
            )
            EnsembleMember.objects.bulk_create(
                EnsembleMember(ensemble=version, member=member, requested_version=requested)
                for member, requested in members
            )
            record_audit_event(
                action=AuditAction.VERSION_REGISTERED, actor=actor, obj_type="version", obj_id=version.pk,
                model=locked, data={"version": number, "sha256": sha256, "size": size, "format": prepared.format,
                                    "sha256_verified": sha256_verified},
            )
            version_registered.send(sender=ModelVersion, model=locked, version=version, actor=actor)
    logger.info("registered %s v%s (%s bytes, sha256 %s)", model.name, number, size, sha256)
    return version



def _check_sample_input(sample, prepared) -> None:
    """A ``metadata.sample_input`` must fit the model's inputs: the rollout's smoke inference sends it."""
    if sample is None or prepared.format not in ArtifactFormat.triton_formats():
        return
    try:
        sample_arrays(sample, prepared.signature)
    except ModelConfigError as exc:
        raise InvalidInput(f"metadata.sample_input does not fit the model: {exc}") from exc


def resolve_alias(model_name: str, alias: str) -> ModelVersion:
    """Return the version an alias of ``model_name`` points at; ``latest`` is the newest live version.

    Raises:
        NotFound: no such model, alias, or (for ``latest``) no version yet.
    """
    model = get_model(model_name)
    live = model.versions.exclude(status=VersionStatus.DELETED)
    if alias in RESERVED_ALIASES:
        version = live.order_by("-version").first()
        if version is None:
            raise NotFound(f"model {model_name!r} has no version yet")
        return version
    try:
        return live.get(aliases__name=alias)
    except ModelVersion.DoesNotExist as exc:
        raise NotFound(f"model {model_name!r} has no alias {alias!r}") from exc


REASON_MAX_LENGTH = 1000


def _clean_reason(reason) -> str:
    reason = (reason or "").strip()
    if len(reason) > REASON_MAX_LENGTH:
        raise InvalidInput(f"the reason must be at most {REASON_MAX_LENGTH} characters; it has {len(reason)}")
    return reason


def alias_is_protected(model: RegisteredModel, alias: str | None) -> bool:
    """True when ``model`` has an alias called ``alias`` and it is protected (locked)."""
    return bool(alias) and Alias.objects.filter(model=model, name=alias, protected=True).exists()


def set_alias(*, model_name: str, alias: str, version: int, actor=None, audit_data: dict | None = None,
              reason: str = "", owner=None) -> Alias:
    """Point ``alias`` of a model at one of its versions, creating or moving it.

    Idempotent: setting an alias to the version it already names writes nothing.
    The model row is locked, so two concurrent moves are serialised and each
    audit event's ``from`` is the version the alias really left. A protected alias moves only
    when an owner of the model's team decides it and gives a reason; both are in the audit event
    (``owner``, ``reason``, ``protected``).

    Args:
        model_name: the registered model.
        alias: the alias name (``modelyard_agent.formats.names.validate_alias``).
        version: the version number to point at.
        actor: the requesting user, or an object with ``username`` (and ``is_authenticated``
            False) naming an automated actor such as a promotion policy.
        audit_data: extra JSON details for the audit event (e.g. the promotion policy that moved it).
        reason: why the alias moves (at most 1000 characters); required for a protected alias.
        owner: the user who decided the move of a protected alias when ``actor`` is an automated
            actor (the owner approving a promotion); default ``actor``.

    Returns:
        The Alias row.

    Raises:
        InvalidInput: bad or reserved alias name; a protected alias without a reason.
        Forbidden: the alias is protected and the deciding user is not an owner of the model's team.
        NotFound: no such model or version.
        Conflict: the version is CORRUPT (an alias followed by deployments must not name it).
    """
    try:
        name = validate_alias(alias)
    except InvalidName as exc:
        raise InvalidInput(str(exc)) from exc
    reason = _clean_reason(reason)
    target = get_version(model_name, version)
    with transaction.atomic():
        model = RegisteredModel.objects.select_for_update().get(pk=target.model_id)
        # delete_version holds the same lock: a version deleted since get_version is not pointed at.
        status = ModelVersion.objects.filter(pk=target.pk).values_list("status", flat=True).first()
        if status in (None, VersionStatus.DELETED):
            raise NotFound(f"model {model_name!r} has no version {version}")
        if status == VersionStatus.CORRUPT:
            raise Conflict(f"{model_name} v{version} is corrupt (its stored bytes do not match its sha256); "
                           "an alias cannot name it")
        current = Alias.objects.filter(model=model, name=name).select_related("version").first()
        if current is not None and current.version_id == target.pk:
            return current
        details = dict(audit_data or {})
        if current is not None and current.protected:
            decider = owner if owner is not None else actor
            if not getattr(decider, "is_authenticated", False):  # an automated actor: a policy, the system
                raise Forbidden(f"@{name} is protected: only an owner of team '{model.team.name}' moves it")
            require(Principal.of(decider), Action.MOVE_ALIAS, model=model, alias=name, protected=True)
            if not reason:
                raise InvalidInput(f"@{name} is protected: moving it needs a reason")
            details.update(protected=True, owner=getattr(decider, "username", None))
        if reason:
            details["reason"] = reason
        previous = current.version.version if current is not None else None
        if current is None:
            current = Alias.objects.create(model=model, name=name, version=target, updated_by=acting_user(actor))
        else:
            current.version = target
            current.updated_by = acting_user(actor)
            current.save(update_fields=["version", "updated_by", "updated_at"])
        record_audit_event(
            action=AuditAction.ALIAS_SET, actor=actor, obj_type="alias", obj_id=current.pk, model=model,
            data={**details, "alias": name, "from": previous, "to": target.version},
        )
        alias_moved.send(sender=Alias, model=model, alias=name, version=target, previous=previous, reason=reason,
                         actor=actor)
    return current


def delete_alias(*, model_name: str, alias: str, actor=None) -> None:
    """Remove an alias from a model (the versions are untouched).

    Raises:
        NotFound: no such model or alias.
        Conflict: the alias is protected (an owner unlocks it first).
    """
    model = get_model(model_name)
    with transaction.atomic():
        RegisteredModel.objects.select_for_update().get(pk=model.pk)
        current = Alias.objects.filter(model=model, name=alias).select_related("version").first()
        if current is None:
            raise NotFound(f"model {model_name!r} has no alias {alias!r}")
        if current.protected:
            raise Conflict(f"@{alias} is protected: an owner of team '{model.team.name}' unlocks it before it "
                           "can be deleted")
        record_audit_event(
            action=AuditAction.ALIAS_DELETED, actor=actor, obj_type="alias", obj_id=current.pk, model=model,
            data={"alias": alias, "from": current.version.version, "to": None},
        )
        current.delete()


def protect_alias(*, model_name: str, alias: str, protected: bool, actor, reason: str = "") -> Alias:
    """Lock (``protected=True``) or unlock an alias; audited as ``alias.protected`` with the reason.

    Idempotent: locking a locked alias (or unlocking an unlocked one) writes nothing.

    Args:
        model_name: the registered model.
        alias: an existing alias of it.
        protected: the new state.
        actor: the requesting user or ``accounts.access.Principal``; an owner of the model's team.
        reason: why (optional, at most 1000 characters).

    Returns:
        The Alias row.

    Raises:
        NotFound: no such model or alias.
        Forbidden: the actor is not an owner of the model's team.
        InvalidInput: the reason is too long.
    """
    model = get_model(model_name)
    reason = _clean_reason(reason)
    principal = Principal.of(actor)
    require(principal, Action.PROTECT_ALIAS, model=model, alias=alias)
    with transaction.atomic():
        RegisteredModel.objects.select_for_update().get(pk=model.pk)
        current = Alias.objects.filter(model=model, name=alias).select_related("version").first()
        if current is None:
            raise NotFound(f"model {model_name!r} has no alias {alias!r}")
        if current.protected == bool(protected):
            return current
        current.protected = bool(protected)
        current.save(update_fields=["protected", "updated_at"])
        record_audit_event(
            action=AuditAction.ALIAS_PROTECTED, actor=principal.user, obj_type="alias", obj_id=current.pk,
            model=model, data={"alias": alias, "protected": current.protected, "version": current.version.version,
                               **({"reason": reason} if reason else {})},
        )
    return current


def may_delete_version(version: ModelVersion, actor) -> bool:
    """True when ``actor`` (a user or an ``accounts.access.Principal``) may delete ``version``: an owner
    of the model's team, or the maintainer who registered it (see ``accounts.access``)."""
    return check(Principal.of(actor), Action.DELETE_VERSION, model=version.model, version=version) is None


def _version_in_use(version: ModelVersion) -> list[str]:
    """What keeps ``version`` from being deleted: live ensembles composing it, and whatever the
    receivers of ``registry.signals.version_deletion_check`` name (the deployments app: hosts that
    serve it or are deploying it). Returns one phrase per reason."""
    reasons = []
    ensembles = (
        version.used_by.exclude(ensemble__status=VersionStatus.DELETED)
        .select_related("ensemble__model").order_by("ensemble__model__name", "ensemble__version")
    )
    names = [f"{m.ensemble.model.name} v{m.ensemble.version}" for m in ensembles]
    if names:
        reasons.append(f"ensemble version(s) {', '.join(names)} compose it")
    for _, found in version_deletion_check.send(sender=ModelVersion, version=version):
        reasons.extend(found)
    return reasons


def delete_version(*, model_name: str, version: int, actor=None) -> ModelVersion:
    """Soft-delete a model version: status DELETED, its aliases removed, all in one transaction.

    The number is never given out again (``RegisteredModel.next_version`` only grows); the artifact
    stays in S3 until ``registry.gc.collect_garbage`` finds no live version referencing it. Audited:
    one ``alias.deleted`` event per removed alias (``from`` the version) and one ``version.deleted``.

    Args:
        model_name: the registered model.
        version: the version number.
        actor: the requesting user or ``accounts.access.Principal``; an owner of the model's team or
            the maintainer who registered the version.

    Returns:
        The version row, now DELETED.

    Raises:
        NotFound: no such model, or no live version with that number (deleting twice is a 404).
        Forbidden: the actor is neither an owner of the model's team nor the maintainer who registered it.
        Conflict: a live ensemble version composes it, or a host serves it or is deploying it
            (the message names them).
    """
    model = get_model(model_name)
    with transaction.atomic():
        # The model lock serialises this with set_alias; the version lock with start_deployment.
        RegisteredModel.objects.select_for_update().get(pk=model.pk)
        row = (
            ModelVersion.objects.select_for_update().filter(model=model, version=version)
            .exclude(status=VersionStatus.DELETED).first()
        )
        if row is None:
            raise NotFound(f"model {model_name!r} has no version {version}")
        require(Principal.of(actor), Action.DELETE_VERSION, model=model, version=row)
        reasons = _version_in_use(row)
        locked = [f"@{a}" for a in row.aliases.filter(protected=True).order_by("name").values_list("name", flat=True)]
        if locked:
            reasons.append(f"the protected alias {', '.join(locked)} names it (an owner moves or unlocks it first)")
        if reasons:
            raise Conflict(f"{model_name} v{version} cannot be deleted: {'; '.join(reasons)}")
        for alias in row.aliases.order_by("name"):
            record_audit_event(
                action=AuditAction.ALIAS_DELETED, actor=actor, obj_type="alias", obj_id=alias.pk, model=model,
                data={"alias": alias.name, "from": version, "to": None, "reason": "version deleted"},
            )
        row.aliases.all().delete()
        row.status = VersionStatus.DELETED
        row.deleted_at = timezone.now()
        row.deleted_by = acting_user(actor)
        row.save(update_fields=["status", "deleted_at", "deleted_by"])
        record_audit_event(
            action=AuditAction.VERSION_DELETED, actor=actor, obj_type="version", obj_id=row.pk, model=model,
            data={"version": version, "sha256": row.artifact_sha256},
        )
        version_deleted.send(sender=ModelVersion, model=model, version=row, actor=actor)
    logger.info("deleted %s v%s", model_name, version)
    return row


def artifact_download_url(version: ModelVersion, *, store: ArtifactStore | None = None) -> str:
    """A presigned GET URL for the version's artifact, valid ``settings.S3_PRESIGN_SECONDS`` seconds.

    The bytes go straight from S3 to the client, never through the web process.
    """
    return (store or ArtifactStore()).presigned_download_url(version.artifact_key)

