"""The host's Bento Store: .bento and .bentomodel archives imported under a host-wide lock.

BentoML's store has no locks, and ``models.get()`` can return a model still being copied; a killed
import leaves a directory that breaks listing the whole store. So the agent never imports into the
store BentoML serves from. Under an exclusive ``flock`` on ``<root>/store.lock`` it imports into a
fresh staging ``BENTOML_HOME`` (BentoML's own ``import_bento`` / ``models.import_model``, in a
subprocess so the agent's BentoML configuration is never touched), checks that exactly the tag the
registry recorded came out, and renames the directories into the store. The rename is atomic on one
file system, so a reader sees a whole Bento or none; what a crash leaves in ``tmp/`` is removed by
the next import, under the same lock.

Layout::

    <root>/store.lock
    <root>/store/bentos/<name>/<version>/     the store every ``bentoml serve`` reads (linked in)
    <root>/store/models/<name>/<version>/
    <root>/tmp/<uuid>/                        staging homes and downloads in progress
    <root>/imported/<kind>/<name>/<version>.json   {"tag", "sha256"} of what was imported
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from modelyard_agent.runtimes.base import StagingError

IMPORT_TIMEOUT_SECONDS = 600.0

_IMPORT_SCRIPT = """
import sys
import bentoml
kind, path = sys.argv[1], sys.argv[2]
imported = bentoml.import_bento(path) if kind == "bento" else bentoml.models.import_model(path)
print(imported.tag)
"""


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block; blocks until free.

    The kernel drops the lock when its holder dies, so a SIGKILLed agent never leaves it held.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def bentoml_env(home: Path) -> dict[str, str]:
    """The environment for a BentoML subprocess working on ``home`` (no telemetry)."""
    # This process's environment is passed on to the child (PATH, the virtualenv, proxies); no setting is read.
    return {**os.environ, "BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "true"}


def tree_digest(directory: Path) -> str:
    """sha256 over the relative paths and contents of every file under ``directory``, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1024 * 1024), b""):
                digest.update(chunk)
    return digest.hexdigest()


class BentoStore:
    """One host's Bento Store and its import records.

    Args:
        root: the agent's BentoML directory (created on first use).
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.home = self.root / "store"
        self.tmp = self.root / "tmp"

    def bento_dir(self, tag: str) -> Path:
        """Where the store keeps the Bento ``name:version``."""
        name, version = tag.split(":", 1)
        return self.home / "bentos" / name / version

    def _record(self, kind: str, tag: str) -> Path:
        name, version = tag.split(":", 1)
        return self.root / "imported" / kind / name / f"{version}.json"

    def is_imported(self, kind: str, tag: str, sha256: str) -> bool:
        """True when ``tag`` was imported from an archive with this sha256 and is still in the store."""
        record = self._record(kind, tag)
        if not record.exists():
            return False
        seen = json.loads(record.read_text())
        if seen.get("sha256") != sha256:
            raise StagingError(
                f"the host's Bento Store already holds {tag} imported from another archive "
                f"(sha256 {seen.get('sha256')}, this one is {sha256}); a tag is never re-imported with other content"
            )
        name, version = tag.split(":", 1)
        return (self.home / ("bentos" if kind == "bento" else "models") / name / version).is_dir()

    def new_work_dir(self, prefix: str = "") -> Path:
        """A fresh directory under ``tmp/``; with prefix ``dl-`` a download the caller removes itself."""
        work = self.tmp / f"{prefix}{uuid.uuid4().hex}"
        work.mkdir(parents=True)
        return work

    def import_archive(self, archive: Path, *, kind: str, tag: str, sha256: str, timeout: float = IMPORT_TIMEOUT_SECONDS
                       ) -> bool:
        """Import one exported archive into the store, idempotently.

        Args:
            archive: the downloaded file, already checked against the registry's size and sha256.
            kind: ``"bento"`` or ``"bentomodel"``.
            tag: the exact tag the registry recorded (``name:version``, never ``latest``).
            sha256: the archive's sha256, kept as the import record.
            timeout: seconds allowed for BentoML's import.

        Returns:
            True when it was imported, False when the store already held it from the same archive.

        Raises:
            StagingError: the archive cannot be imported (corrupt or truncated: BentoML's or the
                decompressor's message is given), it holds another tag than the registry recorded,
                or the store holds that tag (or a model it carries) with other content.
        """
        if ":" not in tag or tag.endswith(":latest"):
            raise StagingError(f"a BentoML deployment needs an exact tag, got {tag!r}")
        self.root.mkdir(parents=True, exist_ok=True)
        with file_lock(self.root / "store.lock"):
            self._remove_leftovers(keep=archive)
            if self.is_imported(kind, tag, sha256):
                return False
            staging = self.new_work_dir()
            try:
                suffix = ".bento" if kind == "bento" else ".bentomodel"
                named = staging / f"artifact{suffix}"
                if archive.stat().st_dev == staging.stat().st_dev:
                    os.link(archive, named)  # BentoML picks the format by the file name's suffix
                else:
                    shutil.copy(archive, named)
                home = staging / "home"
                imported = self._run_import(kind, named, home, timeout)
                if imported != tag:
                    raise StagingError(f"the archive holds {imported}, but the registry recorded {tag}")
                self._move_into_store(home, kind, tag)
                record = self._record(kind, tag)
                record.parent.mkdir(parents=True, exist_ok=True)
                partial = record.with_suffix(".partial")
                partial.write_text(json.dumps({"tag": tag, "sha256": sha256}))
                os.replace(partial, record)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return True

    def _remove_leftovers(self, keep: Path) -> None:
        """Remove staging homes a crashed import left (the caller holds the store lock)."""
        if not self.tmp.is_dir():
            return
        for entry in self.tmp.iterdir():
            if entry.name.startswith("dl-") or keep.is_relative_to(entry):
                continue  # a download in progress belongs to a deploy, which removes it itself
            shutil.rmtree(entry, ignore_errors=True)

    @staticmethod
    def _run_import(kind: str, archive: Path, home: Path, timeout: float) -> str:
        home.mkdir()
        try:
            done = subprocess.run(
                [sys.executable, "-c", _IMPORT_SCRIPT, kind, str(archive)], env=bentoml_env(home),
                capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise StagingError(f"importing the archive took longer than {timeout:g} s", retryable=True) from exc
        if done.returncode != 0:
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            reason = lines[-1] if lines else f"exit status {done.returncode}"
            if "EOFError" in reason or "LZMAError" in reason or "ReadError" in reason:
                reason = f"the archive is truncated or corrupt ({reason})"
            raise StagingError(f"BentoML could not import the archive: {reason}")
        return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""

    def _move_into_store(self, home: Path, kind: str, tag: str) -> None:
        """Rename the staged models, then the Bento, into the store (each rename atomic)."""
        for sub in ("models", "bentos"):
            source_root = home / sub
            if not source_root.is_dir():
                continue
            for source in sorted(p for p in source_root.glob("*/*") if p.is_dir()):
                dest = self.home / sub / source.parent.name / source.name
                if dest.exists():
                    same = tree_digest(dest) == tree_digest(source)
                    if sub == "models" and not same:
                        raise StagingError(
                            f"the host's Bento Store holds model {source.parent.name}:{source.name} with other "
                            "content than this archive carries; BentoML would skip it by tag alone"
                        )
                    if same:
                        continue
                    # A Bento directory without an import record is what a crash between the
                    # rename and the record left; replace it.
                    shutil.rmtree(dest)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.rename(source, dest)
