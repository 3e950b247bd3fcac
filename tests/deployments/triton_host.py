"""Helpers for host-agent tests on a real Triton: an HTTP server for artifacts and agent payloads."""

import functools
import http.server
import tarfile
import threading
from pathlib import Path

import pytest

from modelyard_agent.formats.archives import sha256_file


@pytest.fixture
def artifacts(tmp_path):
    """A plain HTTP server for artifacts (what a presigned S3 URL is to the agent): (root, base URL)."""
    root = tmp_path / "artifacts"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def config_of(archive: Path) -> str:
    """The ``config.pbtxt`` text inside a Triton model archive."""
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("config.pbtxt"))
        return tar.extractfile(member).read().decode()


def agent_payload(archive: Path, base_url: str, triton, *, model: str, version: int,
                  config_text: str | None = None) -> dict:
    """What ``build_agent_payload`` would send for ``archive`` served at ``base_url`` to ``triton``
    (a ``TritonServer``); ``config_text`` defaults to the archive's own config."""
    sha256, size = sha256_file(archive)
    return {
        "target_id": version, "host": "local", "model": model, "version": version,
        "artifact_url": f"{base_url}/{archive.name}", "sha256": sha256, "size": size,
        "config_text": config_of(archive) if config_text is None else config_text,
        "parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)}, "inference_url": triton.http_url,
        "metrics_url": "",
    }
