"""A load that outlasts the host's deadline is abandoned, and the old version keeps serving (real Triton).

Triton cannot cancel a load: while one runs it holds every other load or unload of that model. The
agent stops waiting at the host's deadline, reports Triton's own state for the version, and leaves
Triton the request that undoes the load, which Triton carries out when the load ends.
"""

import time

import pytest

from demo.iris import build_iris_archive
from modelyard_agent.runtimes.triton import TritonRuntime
from modelyard_agent.triton_host import deploy_triton_version
from tests.deployments.triton_host import agent_payload, artifacts
from tests.e2e.support import Traffic, build_slow_iris_archive
from tests.fixtures.services import wait_for

pytestmark = pytest.mark.integration
__all__ = ["artifacts"]  # fixture

DEADLINE = 3.0
SLOW_LOAD = 15.0


@pytest.fixture
def triton_server(start_triton):
    """A server of this module's own: its tests leave a load running past the test's end, which would hold
    the session's shared server (tests/fixtures/triton.py) until it finished."""
    return start_triton()


def deploy(triton, body: dict, load_timeout: float = 60.0, grpc: bool = True) -> dict:
    return deploy_triton_version(body, model_repository=triton.model_repository, load_timeout=load_timeout,
                                 unload_timeout=30, grpc_url=triton.grpc_url if grpc else "")


def state_of(runtime: TritonRuntime, model: str, version: int) -> str:
    return next((e.state for e in runtime.repository_index() if e.name == model and e.version == version), "")


def test_a_load_past_the_deadline_is_abandoned_while_the_old_version_keeps_serving(triton_server, artifacts):
    root, base_url = artifacts
    runtime = TritonRuntime(triton_server.http_url)
    v1 = build_iris_archive(root / "iris-1.tar.gz", name="iris")
    first = deploy(triton_server, agent_payload(v1, base_url, triton_server, model="iris", version=1))
    assert first["state"] == "ready"
    slow = build_slow_iris_archive(root / "iris-2.tar.gz", name="iris", seconds=SLOW_LOAD)

    with Traffic(triton_server.http_url) as traffic:  # keep-alive HTTP, as real clients
        time.sleep(0.5)
        result = deploy(triton_server, agent_payload(slow, base_url, triton_server, model="iris", version=2),
                        load_timeout=DEADLINE)
        # The agent is back while Triton still loads: it did not wait the load out.
        assert state_of(runtime, "iris", 2) == "LOADING"
        assert runtime.ready_versions("iris") == [1]

        # Another model loads meanwhile: the stuck load holds only its own model.
        other = build_iris_archive(root / "other-1.tar.gz", name="other")
        assert deploy(triton_server, agent_payload(other, base_url, triton_server, model="other", version=1))[
            "state"] == "ready"
        assert state_of(runtime, "iris", 2) == "LOADING"

        # When the slow load ends, Triton carries out the unload the agent left it.
        wait_for(lambda: state_of(runtime, "iris", 2) not in ("LOADING", "READY", "UNLOADING"),
                 timeout=SLOW_LOAD + 60, what="the abandoned iris version 2 to be unloaded")
        settled = len(traffic.versions)
        time.sleep(0.5)

    assert result["state"] == "failed" and result["retryable"] is False
    assert (f"Triton did not finish loading iris version 2 within the host's load deadline of {DEADLINE:g} s "
            "and reports it LOADING") in result["error"]
    assert "version 1 keeps serving" in result["error"]
    assert "cannot reach Triton" not in result["error"]
    assert runtime.ready_versions("iris") == [1] and runtime.ready_versions("other") == [1]
    assert traffic.ok > 0 and traffic.failures == []
    # Version 2 may answer between the end of its load and Triton's unload of it (see
    # tests/e2e/test_stuck_load_rollout.py); after that, version 1 alone.
    assert set(traffic.versions[settled:]) == {"1"}


def test_a_first_load_past_the_deadline_leaves_nothing_of_the_model_served(triton_server, artifacts):
    root, base_url = artifacts
    runtime = TritonRuntime(triton_server.http_url)
    slow = build_slow_iris_archive(root / "iris-1.tar.gz", name="iris", seconds=8)
    result = deploy(triton_server, agent_payload(slow, base_url, triton_server, model="iris", version=1),
                    load_timeout=DEADLINE)
    assert result["state"] == "failed"
    assert "no earlier version of iris served here" in result["error"]
    wait_for(lambda: state_of(runtime, "iris", 1) not in ("LOADING", "READY", "UNLOADING"), timeout=60,
             what="the abandoned first load to be unloaded")
    assert runtime.ready_versions("iris") == []


def test_a_load_over_http_stalls_keep_alive_clients_which_is_why_the_agent_loads_over_grpc(triton_server, artifacts):
    """Triton 2.51 runs an HTTP load on the worker thread that received it; a keep-alive connection
    served by that thread waits for the load. The agent therefore loads over gRPC (above: no
    request failed); this shows the fault it avoids, so a Triton that fixes it makes this fail."""
    root, base_url = artifacts
    v1 = build_iris_archive(root / "iris-1.tar.gz", name="iris")
    first = deploy(triton_server, agent_payload(v1, base_url, triton_server, model="iris", version=1))
    assert first["state"] == "ready"
    slow = build_slow_iris_archive(root / "iris-2.tar.gz", name="iris", seconds=SLOW_LOAD)
    with Traffic(triton_server.http_url) as traffic:
        time.sleep(0.5)
        result = deploy(triton_server, agent_payload(slow, base_url, triton_server, model="iris", version=2),
                        load_timeout=DEADLINE, grpc=False)
        runtime = TritonRuntime(triton_server.http_url)
        wait_for(lambda: state_of(runtime, "iris", 2) not in ("LOADING", "READY", "UNLOADING"),
                 timeout=SLOW_LOAD + 60, what="the abandoned iris version 2 to be unloaded")
    assert result["state"] == "failed" and "reports it LOADING" in result["error"]
    assert any("Read timed out" in failure for failure in traffic.failures), traffic.failures
