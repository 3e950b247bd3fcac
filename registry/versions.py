"""Model versions: register one (validate, store in S3, write the row), look one up, presign its download.

Each function takes explicit arguments, runs in one transaction where it writes, and raises
``modelyard.errors`` exceptions that views map to HTTP.
"""

import logging
from contextlib import ExitStack
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from modelyard.errors import InvalidInput, NotFound, ServiceUnavailable
from modelyard_agent.formats.archives import sha256_file
from modelyard_agent.formats.triton_config import ModelConfigError, sample_arrays
from registry.choices import ArtifactFormat, VersionStatus
from registry.formats import PreparedArtifact, prepare_artifact
from registry.formats.triton import resolve_ensemble_members
from registry.locks import artifact_in_use
from registry.models import EnsembleMember, ModelVersion, RegisteredModel
from registry.registered_models import get_model, validate_tags
from registry.signals import version_registered
from registry.storage import ArtifactStore, StorageError, artifact_key

logger = logging.getLogger(__name__)


def get_version(model_name: str, version: int, *, visible_to=None) -> ModelVersion:
    """Return version number ``version`` of model ``model_name`` (not deleted).

    Args:
        visible_to: as for ``registry.registered_models.get_model``.

    Raises:
        NotFound: the model or the version does not exist (or the principal may not read the model).
    """
    model = get_model(model_name, visible_to=visible_to)
    try:
        return model.versions.exclude(status=VersionStatus.DELETED).get(version=version)
    except ModelVersion.DoesNotExist as exc:
        raise NotFound(f"model {model_name!r} has no version {version}") from exc


def check_lineage(lineage: dict | None) -> dict:
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
    clean_tags = validate_tags(tags)
    clean_lineage = check_lineage(lineage)
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


def artifact_download_url(version: ModelVersion, *, store: ArtifactStore | None = None) -> str:
    """A presigned GET URL for the version's artifact, valid ``settings.S3_PRESIGN_SECONDS`` seconds.

    The bytes go straight from S3 to the client, never through the web process.
    """
    return (store or ArtifactStore()).presigned_download_url(version.artifact_key)
