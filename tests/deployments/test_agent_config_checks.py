"""The host agent checks a version's config again before Triton sees it (real Triton).

Registration already refuses these versions (``tests/registry/test_config_file_fields.py``); the
agent must hold too for a version registered before a rule existed, or a payload altered on the way.
"""

import tarfile
from pathlib import Path

import pytest

from demo.iris import build_iris_archive
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_host import deploy_triton_version
from tests.deployments.triton_host import agent_payload, artifacts, config_of

pytestmark = pytest.mark.integration
__all__ = ["artifacts"]  # fixture


def without_member(archive: Path, suffix: str, out: Path) -> Path:
    with tarfile.open(archive) as source, tarfile.open(out, "w:gz") as target:
        for member in source.getmembers():
            if not member.name.endswith(suffix):
                target.addfile(member, source.extractfile(member) if member.isfile() else None)
    return out


def deploy(payload: dict, server) -> dict:
    return deploy_triton_version(payload, model_repository=server.model_repository, load_timeout=60, unload_timeout=30)


def test_the_agent_refuses_a_config_pointing_at_another_models_files(triton_server, artifacts):
    root, base_url = artifacts
    victim = build_iris_archive(root / "victim.tar.gz", name="victim")
    assert deploy(agent_payload(victim, base_url, triton_server, model="victim", version=1,
                              config_text=config_of(victim)), triton_server)["state"] == "ready"

    archive = build_iris_archive(root / "iris.tar.gz", name="iris")
    tampered = config_of(archive) + 'default_model_filename: "../../victim/1/model.py"\n'
    result = deploy(agent_payload(archive, base_url, triton_server, model="iris", version=1, config_text=tampered),
                    triton_server)

    assert result["state"] == "failed" and not result["retryable"]
    assert "default_model_filename '../../victim/1/model.py'" in result["error"]
    assert not (triton_server.model_repository / "iris").exists()
    runtime = TritonRuntime(triton_server.http_url)
    assert runtime.ready_versions("iris") == [] and runtime.ready_versions("victim") == [1]


def test_the_agent_refuses_an_upload_that_sets_a_host_path_parameter(triton_server, artifacts):
    root, base_url = artifacts
    archive = build_iris_archive(root / "iris.tar.gz", name="iris")
    smuggled = config_of(archive) + 'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "/tmp" } }\n'
    result = deploy(agent_payload(archive, base_url, triton_server, model="iris", version=1, config_text=smuggled),
                    triton_server)
    assert result["state"] == "failed" and "per-host setting" in result["error"]
    assert TritonRuntime(triton_server.http_url).ready_versions("iris") == []


def test_a_python_version_without_model_py_is_refused_before_triton_could_hang_on_it(triton_server, artifacts):
    root, base_url = artifacts
    archive = without_member(build_iris_archive(root / "full.tar.gz", name="iris"), "/model.py",
                             root / "iris.tar.gz")
    result = deploy(agent_payload(archive, base_url, triton_server, model="iris", version=1,
                                config_text=config_of(archive)), triton_server)
    assert result["state"] == "failed"
    assert "has no 'model.py'" in result["error"]
    index = TritonRuntime(triton_server.http_url).repository_index()
    assert all(entry.state != "LOADING" for entry in index if entry.name == "iris")


def test_the_archive_without_model_py_keeps_everything_else(tmp_path):
    """The premise of the test above: only ``model.py`` is missing, the ONNX weights are there."""
    archive = without_member(build_iris_archive(tmp_path / "a.tar.gz", name="iris"), "/model.py", tmp_path / "b.tgz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert not any(name.endswith("model.py") for name in names) and any(name.endswith("model.onnx") for name in names)


@pytest.mark.parametrize("name", ["../iris", "a/b", "Iris", ".."])
def test_the_agent_refuses_a_model_name_that_is_no_directory_name(tmp_path, name):
    from modelyard_agent.runtimes.base import StagingError
    from modelyard_agent.triton_staging import AgentPaths, stage_version

    body = {"model": name, "version": 1, "sha256": "0" * 64, "size": 1, "artifact_url": "http://127.0.0.1:9/x",
            "config_text": ""}
    with pytest.raises(StagingError, match="cannot name a model repository directory"):
        stage_version(body, AgentPaths(tmp_path / "models"))
    assert not (tmp_path / "models").exists()
