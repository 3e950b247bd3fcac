"""Triton model directory archives, ensembles included, and the members an ensemble composes."""

from __future__ import annotations

from pathlib import Path

from modelyard.errors import InvalidInput
from modelyard_agent.formats.archives import ArchiveError, ArchiveLimits, inspect_triton_archive
from modelyard_agent.formats.triton_config import (
    ENSEMBLE_PLATFORM,
    ModelConfigError,
    describe_signature,
    ensemble_steps,
    parse_model_config,
)
from modelyard_agent.formats.triton_paths import check_version_files
from registry.choices import ArtifactFormat, VersionStatus
from registry.formats.prepared import PreparedArtifact
from registry.models import ModelVersion

__all__ = ["prepare_triton_archive", "resolve_ensemble_members"]


def prepare_triton_archive(path, *, model_name: str, limits: ArchiveLimits,
                           decode_members: bool = True) -> PreparedArtifact:
    """Check an archive of one Triton model directory; the upload itself is what gets stored.

    Args:
        path: the archive on local disk, or an open seekable binary file over the stored object
            (the returned artifact's ``path`` is then None).
        model_name: the registered model's name; the config's ``name``, when set, must equal it.
        limits: archive bounds.
        decode_members: as for ``inspect_triton_archive``: False reads only a zip's central
            directory and a tar's headers.

    Returns:
        A PreparedArtifact of format TRITON_MODEL_DIR, or TRITON_ENSEMBLE with the composing models
        named by ``ensemble_scheduling.step`` (not yet checked against the registry: see
        :func:`resolve_ensemble_members`).

    Raises:
        InvalidInput: the archive is unsafe or not one model directory, its config does not parse,
            names another model, names a file outside its own directory or sets a host parameter
            (``triton_paths.check_confined_paths``), its version directory lacks the model file the
            backend loads (``model.py`` for the python backend), or it is an ensemble that lists
            itself as a step.
    """
    try:
        layout = inspect_triton_archive(path, limits, decode_members=decode_members)
    except ArchiveError as exc:
        raise InvalidInput(f"artifact refused: {exc}") from exc
    try:
        config = parse_model_config(layout.config_text)
        check_version_files(config, layout.files, layout.version_dir)
    except ModelConfigError as exc:
        raise InvalidInput(str(exc)) from exc
    if config.name and config.name != model_name:
        raise InvalidInput(
            f"config.pbtxt names the model {config.name!r} but it is being registered as {model_name!r}"
        )
    members = tuple(ensemble_steps(config))
    if any(name == model_name for name, _ in members):
        raise InvalidInput(f"the ensemble {model_name!r} lists itself as one of its steps")
    return PreparedArtifact(
        format=(
            ArtifactFormat.TRITON_ENSEMBLE if config.platform == ENSEMBLE_PLATFORM else ArtifactFormat.TRITON_MODEL_DIR
        ),
        path=None if hasattr(path, "read") else Path(path),
        is_original=True,
        config_text=layout.config_text,
        files=layout.files,
        signature=describe_signature(config),
        ensemble_members=members,
    )


def resolve_ensemble_members(
    members: tuple[tuple[str, int], ...], *, team_id: int | None = None, lock: bool = False
) -> list[tuple[ModelVersion, int]]:
    """Find the registered version each ensemble step names.

    A step's ``model_version`` -1 resolves to the newest live (not deleted) version of that model;
    any other number must be a live version.

    Args:
        members: ``(model_name, requested_version)`` pairs, as in ``PreparedArtifact.ensemble_members``.
        team_id: the ensemble's team; its steps may compose only that team's models, since serving
            the ensemble serves them (another team's model answers as missing). None: any team.
        lock: take ``SELECT ... FOR UPDATE`` on the versions found (inside a transaction), so that a
            concurrent delete waits until the ensemble's rows are written.

    Returns:
        ``(ModelVersion, requested_version)`` per distinct version, in the given order (two steps that
        resolve to the same version give one pair).

    Raises:
        InvalidInput: one or more members are missing or are not Triton models; the message lists
            every one of them.
    """
    found: list[tuple[ModelVersion, int]] = []
    missing: list[str] = []
    for name, requested in members:
        live = ModelVersion.objects.filter(model__name=name).exclude(status=VersionStatus.DELETED)
        if team_id is not None:
            live = live.filter(model__team_id=team_id)
        if lock:
            live = live.select_for_update()
        if requested == -1:
            version = live.order_by("-version").first()
            if version is None:
                missing.append(f"{name!r} (no live version registered)")
                continue
        else:
            version = live.filter(version=requested).first()
            if version is None:
                missing.append(f"{name!r} version {requested}")
                continue
        if version.format not in ArtifactFormat.triton_formats():
            missing.append(f"{name!r} version {version.version} (a {version.get_format_display()}, not a Triton model)")
        elif all(version.pk != seen.pk for seen, _ in found):
            found.append((version, requested))
    if missing:
        raise InvalidInput(
            "the ensemble composes models its team does not have in the registry: " + ", ".join(missing)
            + "; register them first, in the ensemble's team"
        )
    return found
