"""Download of a version's artifact on a serving host: stream a presigned URL into a file, checking its size
and sha256 as it goes. Triton staging (``triton_staging``) and the BentoML store import (``bentoml_import``)
both start with it; the agent has no S3 credentials, only the URL the orchestrator signed."""

import hashlib
from pathlib import Path

import requests

from modelyard_agent.runtimes.base import StagingError

DOWNLOAD_CHUNK_BYTES = 1024 * 1024


def download(url: str, dest: Path, *, sha256: str, size: int, timeout: float) -> None:
    """Stream ``url`` into ``dest`` checking size (bytes) and sha256 as it goes.

    Args:
        url: the presigned download URL; dest: the file to write.
        sha256, size: what the registry recorded (hex digest; bytes).
        timeout: seconds allowed between bytes (5 s to connect).

    Raises:
        StagingError: an HTTP error (retryable for 5xx), a broken connection or a short body (retryable),
            more bytes than recorded or another sha256 (not retryable).
    """
    digest = hashlib.sha256()
    seen = 0
    try:
        with requests.get(url, stream=True, timeout=(5, timeout)) as answer:
            if answer.status_code != 200:
                raise StagingError(
                    f"artifact download failed: HTTP {answer.status_code}", retryable=answer.status_code >= 500
                )
            with dest.open("wb") as out:
                for chunk in answer.iter_content(DOWNLOAD_CHUNK_BYTES):
                    seen += len(chunk)
                    if seen > size:
                        raise StagingError(f"artifact download is larger than the registered {size} bytes")
                    digest.update(chunk)
                    out.write(chunk)
    except requests.RequestException as exc:
        raise StagingError(f"artifact download failed: {exc}", retryable=True) from exc
    if seen != size:
        raise StagingError(f"artifact download has {seen} bytes; the registry recorded {size}", retryable=True)
    if digest.hexdigest() != sha256:
        raise StagingError(f"artifact sha256 {digest.hexdigest()} does not match the registered {sha256}")
