"""The host agent's smoke inference on a real Triton: a version that loads but cannot answer its
own sample input is not cut over to, and the old version keeps serving alone."""

import functools
import http.server
import tarfile
import threading
from pathlib import Path

import pytest

from demo.iris import SAMPLE_INPUT, build_iris_archive, expected_labels, sample_input
from deployments.agent import deploy_triton_version
from deployments.runtimes.triton import TritonRuntime
from deployments.runtimes.triton_config import describe_signature, parse_model_config
from registry.archives import sha256_file

pytestmark = pytest.mark.integration


@pytest.fixture
def artifact_server(tmp_path):
    """A plain HTTP server for the artifacts (what a presigned S3 URL is to the agent)."""
    root = tmp_path / "artifacts"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def payload(root: Path, base_url: str, server, version: int, sample: dict) -> dict:
    archive = build_iris_archive(root / f"iris-{version}.tar.gz", name="iris")
    sha256, size = sha256_file(archive)
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("config.pbtxt"))
        config_text = tar.extractfile(member).read().decode()
    return {
        "target_id": version, "host": "local", "model": "iris", "version": version,
        "artifact_url": f"{base_url}/{archive.name}", "sha256": sha256, "size": size, "config_text": config_text,
        "parameters": {"EXECUTION_ENV_PATH": str(server.execution_env)}, "inference_url": server.http_url,
        "metrics_url": "", "sample_input": sample, "signature": describe_signature(parse_model_config(config_text)),
    }


def test_a_version_that_fails_its_smoke_inference_is_not_cut_over_to(triton_server, artifact_server):
    root, base_url = artifact_server
    steps = []

    def deploy(version, sample):
        return deploy_triton_version(
            payload(root, base_url, triton_server, version, sample), model_repository=triton_server.model_repository,
            report=steps.append, load_timeout=120, unload_timeout=60,
        )

    first = deploy(1, {"input": SAMPLE_INPUT})
    assert first["state"] == "ready", first
    on_disk = (triton_server.model_repository / "iris" / "config.pbtxt").read_text()
    # what Triton loads from disk (restart, an ensemble's dependencies) is what the agent served
    assert "EXECUTION_ENV_PATH" in on_disk and "specific" in on_disk
    assert first["details"]["smoke_seconds"] >= 0 and "verifying" in steps

    second = deploy(2, {"input": [[1.0, 2.0]]})  # the wrong shape: the model takes 4 features
    assert second["state"] == "failed"
    assert "smoke inference on iris version 2 failed" in second["error"]

    runtime = TritonRuntime(triton_server.http_url, timeout=10)
    assert runtime.ready_versions("iris") == [1]
    answer = runtime.infer("iris", {"input": sample_input()}, ["label"])
    assert [int(v) for v in answer["label"].reshape(-1)] == expected_labels()


def test_the_cut_over_keeps_serving_the_instance_the_smoke_inference_verified(triton_server, artifact_server):
    root, base_url = artifact_server
    for version in (1, 2):
        result = deploy_triton_version(
            payload(root, base_url, triton_server, version, {"input": SAMPLE_INPUT}),
            model_repository=triton_server.model_repository, load_timeout=120, unload_timeout=60,
        )
        assert result["state"] == "ready", result

    # A bytecode cache written into the version directory during its first load would make Triton
    # reload version 2 at the cut-over, replacing the instance that answered the smoke inference.
    assert not (triton_server.model_repository / "iris" / "2" / "__pycache__").is_dir()
    assert "successfully unloaded 'iris' version 2" not in triton_server.log_text()
    assert "successfully unloaded 'iris' version 1" in triton_server.log_text()
    assert TritonRuntime(triton_server.http_url, timeout=10).ready_versions("iris") == [2]
