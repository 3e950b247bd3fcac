"""Profile copies an agent killed mid-profile leaves on a real Triton are removed by the next heartbeat,
and a running profile's copy is kept."""

import pytest

from demo.iris import build_iris_archive
from modelyard_agent.formats.triton_config import render_load_config
from modelyard_agent.profiling.triton import profile_id_of, remove_stale_copies
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_staging import AgentPaths, stage_version
from tests.deployments.triton_host import agent_payload, artifacts

pytestmark = pytest.mark.integration
__all__ = ["artifacts"]  # fixture


def test_a_copy_no_running_profile_owns_is_unloaded_and_deleted(triton_server, artifacts):
    root, base_url = artifacts
    archive = build_iris_archive(root / "iris.tar.gz", name="iris")
    paths = AgentPaths(triton_server.model_repository)
    runtime = TritonRuntime(triton_server.http_url, load_timeout=120)
    for profile in (7, 8):
        name = f"iris--profile-{profile}"
        payload = agent_payload(archive, base_url, triton_server, model=name, version=1)
        stage_version(payload, paths)
        runtime.load(name, render_load_config(payload["config_text"], model_name=name, versions=[1],
                                              parameters=payload["parameters"]))
    assert runtime.ready_versions("iris--profile-7") == [1]

    assert remove_stale_copies(runtime, paths, active={8}) == ["iris--profile-7"]
    assert runtime.ready_versions("iris--profile-7") == []
    assert not (triton_server.model_repository / "iris--profile-7").exists()
    assert runtime.ready_versions("iris--profile-8") == [1]  # profile 8 still runs: kept
    assert remove_stale_copies(runtime, paths, active={8}) == []


def test_only_profile_copy_names_carry_a_profile_id():
    assert profile_id_of("iris--profile-12") == 12
    assert [profile_id_of(name) for name in ("iris", "iris-profile-1", "--profile-3", "iris--profile-x")] == [
        None, None, None, None]
