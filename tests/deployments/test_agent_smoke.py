"""The host agent's smoke inference on a real Triton: a version that loads but cannot answer its
own sample input is not cut over to, and the old version keeps serving alone."""

from pathlib import Path

import pytest

from demo.iris import SAMPLE_INPUT, build_iris_archive, expected_labels, sample_input
from modelyard_agent.formats.triton_config import describe_signature, parse_model_config
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_host import deploy_triton_version
from tests.deployments.triton_host import agent_payload, artifacts

pytestmark = pytest.mark.integration
__all__ = ["artifacts"]  # fixture


def payload(root: Path, base_url: str, server, version: int, sample: dict) -> dict:
    archive = build_iris_archive(root / f"iris-{version}.tar.gz", name="iris")
    body = agent_payload(archive, base_url, server, model="iris", version=version)
    return {**body, "sample_input": sample,
            "signature": describe_signature(parse_model_config(body["config_text"]))}


def test_a_version_that_fails_its_smoke_inference_is_not_cut_over_to(triton_server, artifacts):
    root, base_url = artifacts
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


def test_the_cut_over_keeps_serving_the_instance_the_smoke_inference_verified(triton_server, artifacts):
    root, base_url = artifacts
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
