"""Staging of a Triton model version on its host: place the version's files in Triton's model repository,
atomically and idempotently, after checking them (``stage_version``).

Runs on the serving host with no database or S3 credentials: everything comes in the payload built by
``deployments.targets.build_agent_payload``. The rolling swap that loads a staged version is
``triton_host``; profiles and replays stage their copies here too (``copies``).

Layout on the host::

    <repo>/<model>/<version>/...              Triton model repository (immutable version dirs)
    <repo>/<model>/config.pbtxt               the config of the last load that served (versions, parameters)
    <staging dir>/                            agent state, same file system as the repository
                                              (default <repo-parent>/.<repo-name>.modelyard/)
        tmp/                                  downloads and extractions in progress
        versions/<model>/<version>/sha256     what a staged version dir was built from
        versions/<model>/<version>/config.pbtxt
"""

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from modelyard_agent.config import default_staging_dir
from modelyard_agent.downloads import download
from modelyard_agent.formats.archives import ArchiveError, ArchiveLimits, extract_version_dir, inspect_triton_archive
from modelyard_agent.formats.names import NAME_PATTERN
from modelyard_agent.formats.triton_config import ModelConfigError, parse_model_config
from modelyard_agent.formats.triton_paths import check_version_files
from modelyard_agent.runtimes.base import StagingError

DISK_MARGIN_BYTES = 64 * 1024 * 1024
BYTECODE_CACHE = "__pycache__"


@dataclass(frozen=True)
class AgentPaths:
    """Where the agent keeps the model repository and its own state.

    Attributes:
        model_repository: Triton's model repository.
        staging_dir: downloads in progress and what each staged version was built from; on the
            repository's file system. None: ``config.default_staging_dir`` (beside the repository).
    """

    model_repository: Path
    staging_dir: Path | None = None

    @property
    def state_dir(self) -> Path:
        return self.staging_dir or default_staging_dir(self.model_repository.resolve())

    def version_dir(self, model: str, version: int) -> Path:
        return self.model_repository / model / str(version)

    def version_state(self, model: str, version: int) -> Path:
        return self.state_dir / "versions" / model / str(version)


def stage_version(payload: dict, paths: AgentPaths, *, timeout: float = 600.0) -> bool:
    """Place the version's files at ``<repo>/<model>/<version>/``, atomically.

    Idempotent: a version dir already staged from the same sha256 is kept.
    The archive is downloaded and extracted in the agent's state dir (same
    file system) and renamed into place, so Triton never sees a partial dir.

    Args:
        payload: the agent payload (model, version, artifact_url, sha256, size, config_text).
        paths: the agent's directories.
        timeout: seconds allowed between bytes of the download.

    Returns:
        True when files were placed, False when the version was already staged.

    Raises:
        StagingError: download failed, content differs from the registry's
            record, the archive is unsafe, the disk is too full, or the
            repository holds a different dir under that version number.
    """
    model, version, sha256 = payload["model"], int(payload["version"]), payload["sha256"]
    if not NAME_PATTERN.match(str(model)) or version < 1:
        # The name becomes a directory of the model repository: hold it to the registry's grammar here too.
        raise StagingError(f"model {model!r} version {version} cannot name a model repository directory")
    target = paths.version_dir(model, version)
    state = paths.version_state(model, version)
    marker = state / "sha256"
    if target.exists():
        if marker.exists() and marker.read_text().strip() == sha256:
            return False
        raise StagingError(
            f"the model repository already holds {model}/{version} with other content; "
            "version directories are never edited in place"
        )
    tmp_root = paths.state_dir / "tmp"
    tmp_root.mkdir(parents=True, exist_ok=True)
    work = tmp_root / uuid.uuid4().hex
    work.mkdir()
    try:
        archive = work / "artifact"
        download(payload["artifact_url"], archive, sha256=sha256, size=int(payload["size"]), timeout=timeout)
        limits = ArchiveLimits.from_payload(payload.get("archive_limits"))
        try:
            layout = inspect_triton_archive(archive, limits)
        except ArchiveError as exc:
            raise StagingError(f"artifact refused: {exc}") from exc
        _check_files_named(payload["config_text"], layout.files, layout.version_dir)
        free = shutil.disk_usage(tmp_root).free
        if free < layout.unpacked_bytes + DISK_MARGIN_BYTES:
            raise StagingError(
                f"not enough disk: {layout.unpacked_bytes} bytes to unpack, {free} bytes free", retryable=True
            )
        unpacked = work / "version"
        try:
            extract_version_dir(archive, layout, unpacked, limits)
        except ArchiveError as exc:
            raise StagingError(f"artifact refused: {exc}") from exc
        _block_bytecode_caches(unpacked)
        state.mkdir(parents=True, exist_ok=True)
        (state / "config.pbtxt").write_text(payload["config_text"])
        target.parent.mkdir(parents=True, exist_ok=True)
        model_config = target.parent / "config.pbtxt"
        if not model_config.exists():
            staged_config = work / "config.pbtxt"
            staged_config.write_text(payload["config_text"])
            os.replace(staged_config, model_config)
        os.rename(unpacked, target)
        marker.write_text(sha256)
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_files_named(config_text: str, files: tuple[str, ...], version_dir: str) -> None:
    """Check again, on the host, what registration checked: the config names no file outside the
    model's directory and the version directory holds the model file its backend loads.

    Raises:
        StagingError: (not retryable) with the config checker's message.
    """
    try:
        check_version_files(parse_model_config(config_text), files, version_dir)
    except ModelConfigError as exc:
        raise StagingError(f"artifact refused: {exc}") from exc


def _block_bytecode_caches(version_dir: Path) -> None:
    """Keep Python from writing ``__pycache__`` directories into a staged version directory.

    Triton reloads every version of a model whose directory changed since its last load. A
    python-backend stub importing ``model.py`` writes ``__pycache__/`` beside it during the first
    load, so the cut-over (a load of the new version alone) would start a second, unverified
    instance of the version the smoke inference just checked, at the cost of a whole load.
    Setting PYTHONDONTWRITEBYTECODE for tritonserver does not stop the stub (Triton 2.51), so the
    defence is in the directory: an empty file named ``__pycache__`` beside each Python source
    makes the interpreter skip writing bytecode (it compiles from source instead), and the
    version directory stays as staged.

    Args:
        version_dir: the extracted version directory, before it is renamed into place.
    """
    for directory in {source.parent for source in version_dir.rglob("*.py")}:
        cache = directory / BYTECODE_CACHE
        if not cache.exists():
            cache.touch()


def staged_config_text(paths: AgentPaths, model: str, version: int, fallback: str) -> str:
    """The config text ``model`` version ``version`` was staged with on this host, else ``fallback``."""
    saved = paths.version_state(model, version) / "config.pbtxt"
    return saved.read_text() if saved.exists() else fallback
