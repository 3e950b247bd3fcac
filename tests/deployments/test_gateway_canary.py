"""A Triton host agent with its gateway: a canary deployed beside the stable version, its percent changed,
promoted and rolled back, on a real Triton behind real nginx, with clients sending all along."""

import json
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from demo.iris import build_iris_archive
from modelyard_agent.adapters.triton import TritonHostAgent, triton_gateway
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.gateway import VERSION_HEADER
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.deployments.test_gateway import BODY, route
from tests.deployments.triton_host import agent_payload, artifacts
from tests.fixtures.clients import HeldRequest, KeptAliveLoad
from tests.fixtures.services import free_port, wait_for

pytestmark = pytest.mark.integration
__all__ = ["artifacts"]  # fixture


@pytest.fixture
def host(triton_server, artifacts, agent_settings, tmp_path):
    """An agent set up with a gateway in front of ``triton_server``; ``host.payload(version, **fields)``."""
    root, base_url = artifacts
    archive = build_iris_archive(root / "iris.tar.gz", name="iris")
    agent_settings(model_repository=triton_server.model_repository, staging_dir=tmp_path / "staging",
                   triton_url=triton_server.http_url)
    gateway_url = f"http://127.0.0.1:{free_port()}"

    class Host:
        agent = TritonHostAgent()
        url = gateway_url
        gateway = triton_gateway(gateway_url)
        triton = TritonRuntime(triton_server.http_url)

        @staticmethod
        def payload(version: int, **fields) -> dict:
            return {**agent_payload(archive, base_url, triton_server, model="iris", version=version),
                    "inference_url": gateway_url, **fields}

        def deploy(self, version: int, **fields) -> dict:
            result = self.agent.deploy(self.payload(version, **fields), report=lambda state: None)
            assert result["state"] == "ready", result
            return result

    yield Host()
    Host.gateway.stop()


def gateway_clients(url: str, count: int = 3) -> KeptAliveLoad:
    """Clients sending requests that name no version through the gateway; ``answers`` holds each answer's
    ``model_version``."""
    return KeptAliveLoad(lambda session, slot: session.post(f"{url}/v2/models/iris/infer", json=BODY, timeout=30),
                         threads=count, value=lambda answer: answer.json()["model_version"])


def shares(url: str, count: int = 400) -> float:
    """The share (0-1) of ``count`` requests that name no version answered by version 2."""
    with requests.Session() as session:
        versions = [session.post(f"{url}/v2/models/iris/infer", json=BODY, timeout=30).headers.get(VERSION_HEADER)
                    for _ in range(count)]
    return versions.count("2") / count


def test_a_canary_serves_its_percent_beside_the_stable_version_and_a_promotion_drops_nothing(host):
    first = host.deploy(1)
    assert first["details"]["route"] is None and host.triton.ready_versions("iris") == [1]

    canary = host.deploy(2, canary_percent=20)
    assert canary["details"]["kept_versions"] == [1]
    assert canary["details"]["route"] == route(1, 2, 20)
    assert host.triton.ready_versions("iris") == [1, 2]
    assert 0.12 <= shares(host.url) <= 0.28  # 400 draws at p = 0.2: four standard deviations

    assert host.agent.route(host.payload(2, stable=1, canary=2, percent=60))["percent"] == 60.0
    assert 0.5 <= shares(host.url) <= 0.7

    with gateway_clients(host.url) as clients:
        promoted = host.deploy(2)
        after = len(clients.answers)
        clients.stop.wait(0.5)
    assert clients.failures == [] and len(clients.answers) > after
    assert set(clients.answers[after:]) == {"2"}
    assert promoted["details"]["route"] is None and host.gateway.routes() == {}
    assert host.triton.ready_versions("iris") == [2]


def test_a_rollback_sends_every_request_to_the_stable_version_before_the_canary_unloads(host):
    host.deploy(1)
    host.deploy(2, canary_percent=50)
    with gateway_clients(host.url) as clients:
        clients.stop.wait(0.5)
        rolled_back = host.deploy(1)
        after = len(clients.answers)
        clients.stop.wait(0.5)
    assert clients.failures == [] and {"1", "2"} <= set(clients.answers[:after])
    assert set(clients.answers[after:]) == {"1"}
    assert rolled_back["details"]["route"] is None and host.triton.ready_versions("iris") == [1]


def test_a_rollback_keeps_the_canary_loaded_until_a_request_on_its_way_to_it_arrives(host):
    """A request the canary's route took, whose body is still on its way when the rollback routes everything
    to the stable version: the canary unloads only once that request was answered (CI once saw one answered
    'version 2 is not at ready state' when the canary unloaded right after the route changed)."""
    host.deploy(1)
    host.deploy(2, canary_percent=100)
    held = HeldRequest(host.url, "/v2/models/iris/infer", json.dumps(BODY).encode())
    wait_for(lambda: host.gateway.inflight().get("iris/2") == 1, timeout=10, what="the held request counted on v2")
    with ThreadPoolExecutor(1) as pool:
        rollback = pool.submit(host.deploy, 1)
        wait_for(lambda: host.gateway.routes().get("iris", {}).get("canary") is None, timeout=60,
                 what="the rollback's route")
        time.sleep(0.5)
        assert host.triton.ready_versions("iris") == [1, 2]
        status, answer = held.finish()
        rolled_back = rollback.result(timeout=120)
    assert status == 200 and answer["model_version"] == "2"
    assert "drain_error" not in rolled_back["details"] and host.triton.ready_versions("iris") == [1]


def test_a_rollback_whose_canary_unloads_past_the_deadline_still_serves_the_stable_version(host, artifacts,
                                                                                         triton_server):
    """A request inside the canary outlasts the host's unload deadline: the rollback is still a success (the stable
    version serves everything, Triton finishes the unload on its own), not a failure after which the control
    plane would hold the canary as served and redeploy it."""
    root, base_url = artifacts
    slow = build_slow_execute_archive(root / "slow.tar.gz", seconds=3)
    host.deploy(1)
    canary = {**agent_payload(slow, base_url, triton_server, model="iris", version=2), "inference_url": host.url,
              "canary_percent": 100}
    assert host.agent.deploy(canary, report=lambda state: None)["state"] == "ready"
    with ThreadPoolExecutor(1) as pool:  # straight to Triton: inside v2 for 3 s, and not counted by the gateway
        inside = pool.submit(requests.post, f"{triton_server.http_url}/v2/models/iris/versions/2/infer", json=BODY,
                             timeout=30)
        time.sleep(0.5)
        rolled_back = host.deploy(1, unload_deadline=1)
        assert inside.result(timeout=30).status_code == 200
    assert "still loaded or unloading after 1 s" in rolled_back["details"]["unload_error"]
    assert "cutover_seconds" not in rolled_back["details"]
    wait_for(lambda: host.triton.ready_versions("iris") == [1], timeout=30, what="v2 unloaded by Triton")


def build_slow_execute_archive(out_path: Path, *, seconds: float) -> Path:
    """iris whose every inference takes ``seconds`` longer."""
    from demo.iris import build_iris_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_iris_model_dir(Path(tmp), name="iris")
        source = model_dir / "1" / "model.py"
        marker = "    def execute(self, requests):\n"
        assert marker in source.read_text()
        slowed = source.read_text().replace(marker, f"{marker}        __import__('time').sleep({seconds!r})\n")
        source.write_text(slowed)
        with tarfile.open(out_path, "w:gz") as archive:
            archive.add(model_dir, arcname="iris")
    return out_path


def test_a_newer_canary_replaces_the_old_one_and_keeps_the_stable_version(host):
    host.deploy(1)
    host.deploy(2, canary_percent=10)
    replaced = host.deploy(3, canary_percent=30)
    assert replaced["details"]["route"] == route(1, 3, 30)
    assert host.triton.ready_versions("iris") == [1, 3]


def test_a_shadow_deployment_gets_copies_while_every_client_answer_comes_from_the_stable_version(host):
    from tests.deployments.test_gateway import _successes

    host.deploy(1)
    shadow = host.deploy(2, canary_percent=0, shadow_percent=100)
    assert shadow["details"]["route"] == route(1, 2, 0, shadow=2, shadow_percent=100)
    before = _successes(host.gateway, 2)
    assert shares(host.url, 100) == 0  # no answer from version 2 reaches a client
    # nginx answers the client before its mirror ends, so the last copy may still be on its way.
    wait_for(lambda: _successes(host.gateway, 2) - before >= 100, timeout=10, what="the 100th shadow copy")
    assert _successes(host.gateway, 2) - before == 100


def test_a_route_naming_a_version_that_is_not_ready_is_refused(host):
    host.deploy(1)
    with pytest.raises(ServingRuntimeError, match=r"version\(s\) \[5\] are not READY"):
        host.agent.route(host.payload(1, stable=1, canary=5, percent=10))
    assert host.gateway.routes() == {}


def test_a_canary_on_an_agent_without_a_gateway_fails_with_what_to_do(host, agent_settings):
    agent_settings(triton_url="")
    result = host.agent.deploy(host.payload(1, canary_percent=10), report=lambda state: None)
    assert result["state"] == "failed" and "--triton-url" in result["error"]


def test_the_heartbeat_reports_the_gateway_and_its_routes_and_reads_triton_directly(host):
    host.deploy(1)
    host.deploy(2, canary_percent=5)
    report = host.agent.heartbeat({"host": "local", "inference_url": host.url, "metrics_url": "", "runtime": "triton"})
    assert report["runtime_live"] is True and report["errors"] == []
    assert report["gateway"] == {"live": True, "routes": {"iris": route(1, 2, 5)}, "capture": {},
                                 "residency": {"models": {}, "budget": {}}, "footprints": {}}
    assert {(m["name"], m["version"]) for m in report["models"]} >= {("iris", 1), ("iris", 2)}
