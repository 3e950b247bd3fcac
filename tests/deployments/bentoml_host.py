"""Fixtures for BentoML host agent tests: an artifact server for the session's Bentos
(``tests/fixtures/bentos.py``), an agent root with its nginx, and payloads as ``build_agent_payload``
writes them."""

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from modelyard_agent.bentoml_instances import stop_host
from modelyard_agent.formats.archives import sha256_file
from modelyard_agent.runtimes import bentoml as serve
from registry.choices import ArtifactFormat
from registry.formats import archive_limits
from registry.formats.bento import prepare_bentoml_archive
from tests.fixtures.bentos import MODEL
from tests.fixtures.services import free_port

SAMPLE = {"features": [[0.0, 1.0]]}


@pytest.fixture
def artifact_server(bentos):
    """A plain HTTP server for the session's Bentos (what a presigned S3 URL is to the agent)."""
    root = next(iter(bentos.values())).parent.parent
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def agent_root(tmp_path):
    """The agent's BentoML directory and the inference URL its nginx listens on; on teardown every
    ``bentoml serve`` it started and its nginx are stopped."""
    root = tmp_path / "bentoml-agent"
    url = f"http://127.0.0.1:{free_port()}"
    yield root, url
    stop_host(root, url, timeout=10)
    shutil.rmtree(root, ignore_errors=True)


def make_payload(archive: Path, base_url: str, inference_url: str, version: int, *, sample=SAMPLE) -> dict:
    """The agent payload for ``archive`` (a .bento or .bentomodel under the artifact server)."""
    kind = ArtifactFormat.BENTO if archive.suffix == ".bento" else ArtifactFormat.BENTOML_MODEL
    prepared = prepare_bentoml_archive(archive, kind, model_name=MODEL, limits=archive_limits())
    sha256, size = sha256_file(archive)
    return {
        "target_id": version, "host": "bento-host", "runtime": "bentoml", "format": kind, "model": MODEL,
        "version": version, "artifact_url": f"{base_url}/{archive.parent.name}/{archive.name}", "sha256": sha256,
        "size": size, "config_text": prepared.config_text, "parameters": {}, "config_overrides": {},
        "sample_input": sample, "signature": prepared.signature, "inference_url": inference_url, "metrics_url": "",
    }


def serving_homes(root: Path) -> list[str]:
    """The instance homes under ``root`` that still have a live process."""
    instances = root / "instances"
    return sorted(str(h) for h in instances.glob("*") if serve.processes_of(str(h))) if instances.is_dir() else []
