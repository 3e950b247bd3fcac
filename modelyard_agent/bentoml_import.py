"""Import of a version into a BentoML host's Bento Store (``import_into_store``): download its archive, size and
sha256 checked, and import it under the store's lock, once per sha256. A deployment (``bentoml_host``) and a
profile (``profiling.bentoml``) of a version both start here."""

from __future__ import annotations

import shutil

from modelyard_agent.downloads import download
from modelyard_agent.runtimes.base import StagingError
from modelyard_agent.runtimes.bento_store import BentoStore, file_lock


def import_into_store(payload: dict, store: BentoStore, *, kind: str, tag: str, timeout: float) -> bool:
    """Download a version's artifact (size and sha256 checked) and import it into the host's store.

    Args:
        payload: a deploy or profile payload (artifact_url, sha256, size in bytes).
        store: the host's Bento Store.
        kind: ``BENTO`` or ``BENTO_MODEL``; tag: the BentoML tag the version records.
        timeout: seconds allowed between bytes of the download, and for the import.

    Returns:
        True when imported now, False when the store already held it (same sha256).

    Raises:
        StagingError: no tag, or the download or import failed.
    """
    if not tag:
        raise StagingError("the version records no BentoML tag; it was not registered as a BentoML archive")
    store.root.mkdir(parents=True, exist_ok=True)
    with file_lock(store.root / "store.lock"):
        if store.is_imported(kind, tag, payload["sha256"]):
            return False
    work = store.new_work_dir(prefix="dl-")
    try:
        archive = work / "artifact"
        download(payload["artifact_url"], archive, sha256=payload["sha256"], size=int(payload["size"]),
                  timeout=timeout)
        return store.import_archive(archive, kind=kind, tag=tag, sha256=payload["sha256"], timeout=timeout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
