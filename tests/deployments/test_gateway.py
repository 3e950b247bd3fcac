"""The gateway of a Triton host: real nginx (with its Lua module) in front of a real tritonserver."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from demo.iris import sample_input
from modelyard_agent.adapters.triton import drain_routed
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.gateway import ROUTING_KEY_HEADER, VERSION_HEADER, TritonGateway
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.deployments.test_triton_runtime import MODEL, load_iris
from tests.fixtures.clients import HeldRequest, KeptAliveLoad
from tests.fixtures.services import free_port, traversable, wait_for

pytestmark = pytest.mark.integration

BODY = {"inputs": [{"name": "input", "shape": [len(sample_input()), 4], "datatype": "FP32",
                    "data": [float(x) for row in sample_input() for x in row]}], "outputs": [{"name": "label"}]}


def route(stable: int, canary: int | None, percent: float, shadow: int | None = None,
          shadow_percent: float = 0.0) -> dict:
    """A route as the gateway answers it."""
    return {"stable": stable, "canary": canary, "percent": float(percent), "shadow": shadow,
            "shadow_percent": float(shadow_percent)}


@pytest.fixture
def gateway(triton_server, tmp_path):
    """iris versions 1 and 2 loaded on a real Triton (reset before each test: the modules that import this fixture
    count Triton's own statistics), and a running gateway in front of it."""
    load_iris(triton_server, tmp_path, versions=[1, 2])
    front = TritonGateway(tmp_path / "gateway", free_port(), triton=triton_server.http_url.removeprefix("http://"),
                          listen_host="127.0.0.1")
    front.ensure_running()
    front.url = f"http://127.0.0.1:{front.listen_port}"
    yield front
    front.stop()


def infer(session: requests.Session, gateway, version: int | None = None, key: str | None = None):
    path = f"/v2/models/{MODEL}/versions/{version}/infer" if version else f"/v2/models/{MODEL}/infer"
    return session.post(gateway.url + path, json=BODY, timeout=30,
                        headers={ROUTING_KEY_HEADER: key} if key else {})


def test_it_passes_the_client_endpoints_and_refuses_the_repository_api(gateway):
    with requests.Session() as session:
        ready = session.get(f"{gateway.url}/v2/health/ready", timeout=10)
        assert ready.status_code == 200, TritonRuntime(f"http://{gateway.triton}").repository_index()
        assert session.get(f"{gateway.url}/v2/models/{MODEL}/versions/1", timeout=10).json()["name"] == MODEL
        assert session.get(f"{gateway.url}/v2/models/{MODEL}/versions/1/stats", timeout=10).status_code == 200
        answer = infer(session, gateway)
        assert answer.status_code == 200 and VERSION_HEADER not in answer.headers
        assert answer.json()["model_version"] == "2"  # no route: Triton's newest ready version
        for path in ("/v2/repository/index", f"/v2/repository/models/{MODEL}/unload", "/v2/logging",
                     "/v2/trace/setting", f"/v2/models/{MODEL}/trace/setting", "/v2/systemsharedmemory/status"):
            refused = session.post(gateway.url + path, json={}, timeout=10)
            assert refused.status_code == 403 and "not a client endpoint" in refused.text, path
    assert TritonRuntime(f"http://{gateway.triton}").ready_versions(MODEL) == [1, 2]


def test_a_route_splits_requests_that_name_no_version_by_its_percent(gateway):
    gateway.set_route(MODEL, stable=1, canary=2, percent=10)
    seen = {"1": 0, "2": 0}
    with requests.Session() as session:
        for _ in range(2000):
            answer = infer(session, gateway)
            assert answer.status_code == 200
            assert answer.headers[VERSION_HEADER] == answer.json()["model_version"]
            seen[answer.headers[VERSION_HEADER]] += 1
        # Requests that name a version reach it, whatever the route says.
        named = [infer(session, gateway, version=1).json()["model_version"] for _ in range(50)]
    # 2000 draws at p = 0.1: one standard deviation is 0.67 points, so ±2 points is three.
    assert abs(seen["2"] / 2000 * 100 - 10) <= 2, seen
    assert set(named) == {"1"}


def test_a_routing_key_always_reaches_the_same_version_and_a_higher_percent_only_adds_keys(gateway):
    gateway.set_route(MODEL, stable=1, canary=2, percent=30)
    keys = [f"user-{n}" for n in range(60)]
    with requests.Session() as session:
        first = {key: {infer(session, gateway, key=key).headers[VERSION_HEADER] for _ in range(3)} for key in keys}
        gateway.set_route(MODEL, stable=1, canary=2, percent=60)
        later = {key: infer(session, gateway, key=key).headers[VERSION_HEADER] for key in keys}
    assert all(len(versions) == 1 for versions in first.values()), first
    on_canary = {key for key, versions in first.items() if versions == {"2"}}
    assert on_canary and on_canary < {key for key, version in later.items() if version == "2"}


def kept_alive(gateway, versioned: bool = False) -> KeptAliveLoad:
    """Four clients sending infer requests naming no version (with ``versioned``, the fourth names v1)."""
    return KeptAliveLoad(lambda session, slot: infer(session, gateway, version=1 if versioned and slot == 3 else None),
                         threads=4)


def closes(load: KeptAliveLoad) -> list[str | None]:
    """The answers that said ``Connection: close``, each as the ``X-Modelyard-Version`` it carried."""
    return [answer.headers.get(VERSION_HEADER) for answer in load.answers
            if answer.headers.get("Connection", "").lower() == "close"]


def test_changing_routes_reloads_nothing_and_fails_no_keep_alive_client(gateway):
    workers_before = set(_workers(gateway))
    with kept_alive(gateway) as clients:
        for percent in [0, 5, 25, 50, 75, 100, 50, 0] * 3:
            gateway.set_route(MODEL, stable=1, canary=2, percent=percent)
            clients.stop.wait(0.1)
        gateway.remove_route(MODEL)
        clients.stop.wait(0.2)
    assert clients.failures == [] and min(clients.counts) > 0, (clients.failures[:5], clients.counts)
    assert closes(clients) == []
    assert set(_workers(gateway)) == workers_before
    assert gateway.routes() == {}
    assert set(gateway.inflight().values()) <= {0}  # every routed request ended and was counted out


def test_a_reload_drains_first_so_no_kept_alive_client_loses_a_request(gateway):
    """Without the drain, 1 request in about 1,200 failed over 3 reloads ("connection reset by peer"): the old
    workers close idle kept-alive connections as a client sends on one."""
    gateway.DRAIN_SECONDS = 0.3
    gateway.set_route(MODEL, stable=1, canary=2, percent=50)
    workers = set(_workers(gateway))
    with kept_alive(gateway, versioned=True) as clients:
        for _ in range(8):
            gateway.reload()
            assert set(_workers(gateway)) - workers  # new workers took over
            workers = set(_workers(gateway))
            clients.stop.wait(0.2)
    assert clients.failures == [] and min(clients.counts) > 0, (clients.failures[:5], clients.counts)
    assert len(closes(clients)) >= 8  # each drain told the busy clients to reconnect
    # ... after their requests went through their own locations: routed by the 50 % route (or naming v1).
    assert set(closes(clients)) <= {"1", "2", None} and {"1", "2"} <= set(closes(clients))
    assert gateway._control("GET", path="/drain")["draining"] is False
    with requests.Session() as session:  # and keep-alive is back once the reload is done
        assert infer(session, gateway).headers.get("Connection", "").lower() != "close"


def test_a_drain_ends_as_soon_as_no_client_connection_is_open(gateway):
    # No client connected: nothing can lose a request to the reload, so the drain does not wait its time out. The
    # probe that saw the gateway start closed its connection, which nginx may not have counted out yet.
    wait_for(lambda: gateway._client_connections() == 0, timeout=10, what="the start's probe counted out")
    assert gateway._sleep_out_drain(60) is True
    with requests.Session() as session:
        assert infer(session, gateway).status_code == 200  # its connection stays open, idle, kept alive
        assert gateway._client_connections() == 1
        assert gateway._sleep_out_drain(0.2) is False  # it may send at the reload: the drain runs its time
    wait_for(lambda: gateway._client_connections() == 0, timeout=10, what="the closed connection counted out")


def test_a_restarted_gateway_routes_as_it_did(gateway):
    gateway.set_route(MODEL, stable=2, canary=1, percent=100)
    gateway.stop()
    assert gateway.master_pid() is None
    gateway.ensure_running()
    assert gateway.routes() == {MODEL: route(2, 1, 100)}
    with requests.Session() as session:
        assert infer(session, gateway).headers[VERSION_HEADER] == "1"


def test_it_refuses_bad_routes_and_keeps_the_ones_it_holds(gateway):
    gateway.set_route(MODEL, stable=1, canary=2, percent=20)
    with pytest.raises(ValueError, match="from 0 to 100"):
        gateway.set_route(MODEL, stable=1, canary=2, percent=101)
    with pytest.raises(ServingRuntimeError, match="must be"):
        gateway._control("POST", {MODEL: {"stable": "one", "percent": 5}})
    assert gateway.routes() == {MODEL: route(1, 2, 20)}


def _workers(gateway) -> list[int]:
    master = gateway.master_pid()
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent(p) == master]


def _parent(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _successes(gateway, version: int) -> int:
    stats = requests.get(f"http://{gateway.triton}/v2/models/{MODEL}/versions/{version}/stats", timeout=10).json()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def test_a_shadow_gets_a_copy_of_its_share_and_no_client_ever_sees_its_answer(gateway):
    gateway.set_route(MODEL, stable=1, shadow=2, shadow_percent=100)
    before = _successes(gateway, 2)
    with requests.Session() as session:
        answers = [infer(session, gateway) for _ in range(200)]
    assert {(a.status_code, a.headers[VERSION_HEADER], a.json()["model_version"]) for a in answers} == {(200, "1", "1")}
    # Every request was copied. nginx answers the client before its mirror ends (it holds the connection's
    # next request instead), so the last copy may still be on its way when the client has its answer.
    wait_for(lambda: _successes(gateway, 2) - before >= 200, timeout=10, what="the 200th shadow copy")
    assert _successes(gateway, 2) - before == 200

    gateway.set_route(MODEL, stable=1, shadow=2, shadow_percent=25)
    before = _successes(gateway, 2)
    with requests.Session() as session:
        assert all(infer(session, gateway).json()["model_version"] == "1" for _ in range(800))
    # 800 draws at p = 0.25: one standard deviation is 12 copies.
    assert 150 <= _successes(gateway, 2) - before <= 250
    assert gateway.routes()[MODEL] == route(1, None, 0, shadow=2, shadow_percent=25)
    assert set(gateway.inflight().values()) == {0}  # requests and their copies were counted out


def test_a_routed_request_counts_in_flight_on_its_version_until_it_ends(gateway):
    """What a rollback waits on before the canary unloads: a request the old route gave the canary, still on
    its way to Triton after the route changed."""
    gateway.set_route(MODEL, stable=1, canary=2, percent=100)
    held = HeldRequest(gateway.url, f"/v2/models/{MODEL}/infer", json.dumps(BODY).encode())
    wait_for(lambda: gateway.inflight().get(f"{MODEL}/2") == 1, timeout=10, what="the held request counted on v2")
    gateway.set_route(MODEL, stable=1)
    with pytest.raises(ServingRuntimeError, match=r"1 request\(s\) to iris v2 still in flight"):
        gateway.wait_idle(MODEL, 2, timeout=0.3)
    gateway.wait_idle(MODEL, 1, timeout=0.3)  # nothing on its way to v1
    status, answer = held.finish()
    assert status == 200 and answer["model_version"] == "2"
    gateway.wait_idle(MODEL, 2, timeout=10)
    assert gateway.inflight()[f"{MODEL}/2"] == 0


def test_what_a_worker_that_died_counted_in_flight_no_longer_holds_a_version(gateway):
    gateway.set_route(MODEL, stable=1, canary=2, percent=100)
    held = HeldRequest(gateway.url, f"/v2/models/{MODEL}/infer", json.dumps(BODY).encode())
    wait_for(lambda: gateway.inflight().get(f"{MODEL}/2") == 1, timeout=10, what="the held request counted on v2")
    gateway.set_route(MODEL, stable=1)
    assert drain_routed(gateway, MODEL, kept=[1], timeout=0.3) == [
        "1 request(s) to iris v2 still in flight after 0.3 s"]
    (worker,) = {int(key.rsplit("/", 1)[1]) for key, count in gateway._control("GET", path="/inflight").items()
                 if key.startswith(f"{MODEL}/2/") and count}
    os.kill(worker, signal.SIGKILL)  # its request is lost with it, and so is its count
    wait_for(lambda: not Path(f"/proc/{worker}").exists(), timeout=10, what="the worker gone")
    assert drain_routed(gateway, MODEL, kept=[1], timeout=0.3) == []
    held.connection.close()


@pytest.fixture
def grpc_gateway(triton_server, tmp_path):
    """iris versions 1 and 2 on a real Triton, and a gateway taking HTTP and gRPC in front of it."""
    load_iris(triton_server, tmp_path, versions=[1, 2])
    front = TritonGateway(tmp_path / "gateway", free_port(), triton=triton_server.http_url.removeprefix("http://"),
                          listen_host="127.0.0.1", grpc_listen=f"127.0.0.1:{free_port()}",
                          triton_grpc=triton_server.grpc_url)
    front.ensure_running()
    yield front
    front.stop()


def test_grpc_clients_infer_through_the_gateway_and_cannot_reach_the_repository_api(grpc_gateway):
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(grpc_gateway.grpc_listen)
    try:
        assert client.is_server_live() and client.is_model_ready(MODEL, "1")
        assert client.get_model_metadata(MODEL, "2").name == MODEL
        tensor = grpcclient.InferInput("input", [len(sample_input()), 4], "FP32")
        tensor.set_data_from_numpy(np.asarray(sample_input(), dtype=np.float32))
        answer = client.infer(MODEL, [tensor], model_version="1", outputs=[grpcclient.InferRequestedOutput("label")])
        assert answer.get_response().model_version == "1"
        assert answer.as_numpy("label").shape[0] == len(sample_input())
        for refused in (lambda: client.unload_model(MODEL), lambda: client.get_model_repository_index(),
                        lambda: client.get_system_shared_memory_status(), lambda: client.get_log_settings()):
            with pytest.raises(InferenceServerException, match="not a client method"):
                refused()
    finally:
        client.close()
    assert TritonRuntime(f"http://{grpc_gateway.triton}").ready_versions(MODEL) == [1, 2]


def test_a_gateway_without_tritons_grpc_address_takes_no_grpc(tmp_path):
    with pytest.raises(ValueError, match="Triton's own gRPC address"):
        TritonGateway(tmp_path / "gateway", free_port(), triton="127.0.0.1:8000", grpc_listen="127.0.0.1:8011")


CONNECT = """
import os, socket, sys
os.stat(os.path.dirname(os.path.dirname(sys.argv[1])))  # the gateway's directory is reachable (else exit 1)
client = socket.socket(socket.AF_UNIX)
try:
    client.connect(sys.argv[1])
except PermissionError:
    sys.exit(13)
client.sendall(b"GET /routes HTTP/1.0\\r\\n\\r\\n")
sys.stdout.write(client.recv(200).decode(errors="replace"))
"""


def test_the_control_socket_opens_for_the_agents_user_only(tmp_path):
    front = TritonGateway(traversable(tmp_path) / "gateway", free_port(), triton="127.0.0.1:1", listen_host="127.0.0.1")
    front.ensure_running()
    try:
        directory = front.control_socket.parent.stat()
        assert directory.st_mode & 0o777 == 0o700 and directory.st_uid == os.geteuid(), oct(directory.st_mode)
        assert front.routes() == {}  # the agent's user reaches it
        if os.geteuid() != 0:
            pytest.skip("trying the socket as another user needs root")
        other = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
                                "-c", CONNECT, str(front.control_socket)], capture_output=True, text=True, timeout=30)
        assert other.returncode == 13, (other.returncode, other.stdout, other.stderr)
    finally:
        front.stop()
