"""Helpers for host-agent tests on a real Triton: an HTTP server for artifacts and agent payloads."""

import contextlib
import functools
import http.server
import shutil
import tarfile
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelyard_agent.formats.archives import sha256_file
from modelyard_agent.runtimes.gateway import TritonGateway
from tests.fixtures.services import free_port


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


@contextlib.contextmanager
def gateway_in_front(triton_server) -> Iterator[TritonGateway]:
    """A running gateway in front of a real Triton, with ``.url`` (``http://127.0.0.1:<port>``), in a
    directory nginx's workers may traverse (they run as ``nobody`` when the tests run as root, and pytest's
    own temporary directories are private to root); stopped and removed on exit."""
    home = Path(tempfile.mkdtemp(prefix="modelyard-gateway-"))
    home.chmod(0o711)
    front = TritonGateway(home / "gateway", free_port(), triton=triton_server.http_url.removeprefix("http://"),
                          listen_host="127.0.0.1")
    try:
        front.ensure_running()
        front.url = f"http://127.0.0.1:{front.listen_port}"
        yield front
    finally:
        front.stop()
        shutil.rmtree(home, ignore_errors=True)


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
