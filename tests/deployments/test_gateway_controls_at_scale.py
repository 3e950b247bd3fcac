"""The gateway's control socket at the scale a host reaches: 2,000 models registered on demand and 2,000 routed,
on a real nginx with its Lua modules (no Triton is needed to drive the controls)."""

import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.gateway import TritonGateway
from modelyard_agent.runtimes.routes import _UnixConnection, make_route
from tests.fixtures.services import free_port

pytestmark = pytest.mark.integration

NAMES = [f"many_{i:04d}" for i in range(2000)]


@pytest.fixture
def gateway(tmp_path):
    gateway = TritonGateway(tmp_path / "gateway", free_port(), triton=f"127.0.0.1:{free_port()}",
                            listen_host="127.0.0.1")
    gateway.ensure_running()
    yield gateway
    gateway.stop()


def test_every_control_takes_2000_models_at_once(gateway):
    # Every body below is far past nginx's default 16-KiB body buffer (some 60 bytes a model).
    capture = {name: {"fraction": 0.5, "max_bytes": 1 << 20, "retention_seconds": 3600} for name in NAMES}
    assert len(json.dumps(capture)) > 64 * 1024
    assert set(gateway._control("POST", capture, path="/capture")) == set(NAMES)
    usage = gateway._control("PUT", {name: 10 for name in NAMES}, path="/capture")
    assert usage["many_1999"]["bytes"] == 10
    assert set(gateway._control("POST", {name: [1, 2] for name in NAMES}, path="/series")) == set(NAMES)
    routes = gateway._control("POST", {name: make_route(stable=1, canary=2, percent=5) for name in NAMES})
    assert set(routes) == set(NAMES)
    residency = gateway._control("POST", {"models": {name: {"pinned": False, "cold_start_timeout": 5, "max_held": 4}
                                                     for name in NAMES}}, path="/residency")
    assert set(residency["models"]) == set(NAMES)
    limits = gateway._control("POST", {name: 1 << 20 for name in NAMES}, path="/limits")
    assert set(limits["models"]) == set(NAMES)
    # A drain and a state report are small whatever the host holds; padded past the buffer, they are still read.
    padding = "x" * (64 * 1024)
    assert gateway._control("POST", {"draining": False, "padding": padding}, path="/drain")["draining"] is False
    report = gateway._control("PUT", {"model": "many_0007", "state": "resident", "padding": padding},
                              path="/residency/state")
    assert report["models"]["many_0007"]["state"] == "resident"
    # The last one is on demand indeed: with no loader polling, its request is answered at once.
    answer = requests.post(f"http://127.0.0.1:{gateway.listen_port}/v2/models/many_1999/infer", json={}, timeout=10)
    assert answer.status_code == 503 and answer.json()["reason"] == "no_loader", answer.text


def test_a_control_body_past_the_bound_is_refused_naming_the_bound(gateway):
    with pytest.raises(ServingRuntimeError) as refused:
        gateway._control("POST", {"padding": "x" * (65 << 20)}, timeout=60)
    assert "64 MiB" in str(refused.value), refused.value


def recording_controls(gateway, monkeypatch) -> list[tuple[str, str, int, int]]:
    """Each control the gateway sends from now on, as it went: (method, path, body bytes, answer bytes)."""
    sent, control = [], gateway._control

    def recording(method, body=None, timeout=5.0, path="/routes"):
        answer = control(method, body, timeout, path)
        sent.append((method, path, len(json.dumps(body)), len(json.dumps(answer))))
        return answer

    monkeypatch.setattr(gateway, "_control", recording)
    return sent


def test_changing_one_route_among_2000_sends_that_route_alone_and_a_restart_brings_back_all(gateway, monkeypatch):
    gateway.routes_file.write_text(json.dumps({name: make_route(stable=1) for name in NAMES}))
    assert len(gateway.resync_routes()) == 2000
    sent = recording_controls(gateway, monkeypatch)
    assert gateway.set_route("many_0005", stable=2, canary=3, percent=10) == make_route(stable=2, canary=3, percent=10)
    gateway.set_route("one_more", stable=1)
    gateway.remove_route("many_0000")
    assert [method for method, *_ in sent] == ["PATCH"] * 3, sent
    assert all(body < 1024 and answered < 1024 for _, _, body, answered in sent), sent
    monkeypatch.undo()
    assert_routes_changed(gateway.routes())
    # A gateway that starts again reads every route from routes.json.
    gateway.stop()
    gateway.ensure_running()
    assert_routes_changed(gateway.routes())


def test_changing_one_request_limit_among_2000_sends_that_limit_alone(gateway, monkeypatch):
    gateway.limits_file.write_text(json.dumps({name: 1 << 20 for name in NAMES}))
    gateway._control("POST", {name: 1 << 20 for name in NAMES}, path="/limits")
    sent = recording_controls(gateway, monkeypatch)
    assert gateway.set_request_limit("many_0005", 4096)["models"] == {"many_0005": 4096}
    assert gateway.set_request_limit("many_0000", None)["models"] == {}
    assert [method for method, *_ in sent] == ["PATCH"] * 2, sent
    assert all(body < 1024 and answered < 1024 for _, _, body, answered in sent), sent
    monkeypatch.undo()
    held = gateway.request_limits()["models"]
    assert len(held) == 1999 and "many_0000" not in held and held["many_0005"] == 4096
    assert held["many_0001"] == 1 << 20


def assert_routes_changed(held: dict) -> None:
    assert len(held) == 2000 and "many_0000" not in held and held["one_more"] == make_route(stable=1)
    assert held["many_0005"]["canary"] == 3 and held["many_0001"] == make_route(stable=1)


def infer_status(gateway, model: str) -> tuple[int, str]:
    answer = requests.post(f"http://127.0.0.1:{gateway.listen_port}/v2/models/{model}/infer", json={}, timeout=10)
    return answer.status_code, answer.text


def test_registering_one_model_among_2000_sends_that_model_alone_and_a_restart_brings_back_all(gateway, monkeypatch):
    settings = {"pinned": False, "cold_start_timeout": 5.0, "max_held": 4}
    gateway.residency_file.write_text(json.dumps({"models": {name: settings for name in NAMES}}))
    assert len(gateway.resync_residency()["models"]) == 2000
    sent = recording_controls(gateway, monkeypatch)
    answer = gateway.register_on_demand("one_more", cold_start_timeout=7, state="resident")
    assert set(answer["models"]) == {"one_more"} and answer["models"]["one_more"]["state"] == "resident"
    assert gateway.unregister_on_demand("many_0000")["models"] == {}
    assert gateway.report_residency("many_0001", "resident")["models"]["many_0001"]["state"] == "resident"
    # Each change went alone, and its answer names it alone: not the 2,000 others (some 150 KB each way).
    assert [method for method, *_ in sent] == ["PATCH", "PATCH", "PUT"], sent
    assert all(body < 1024 and answered < 1024 for _, _, body, answered in sent), sent
    monkeypatch.undo()
    held = gateway.residency()["models"]
    assert len(held) == 2000 and "many_0000" not in held and held["one_more"]["cold_start_timeout"] == 7
    # Every worker sees the changes at its next request: a cold model is held (no loader: 503 at once), one_more
    # (resident) and many_0000 (no longer on demand) pass to Triton (none listens: 502).
    assert infer_status(gateway, "many_0002")[0] == 503
    assert infer_status(gateway, "one_more")[0] == 502
    assert infer_status(gateway, "many_0000")[0] == 502
    # A gateway that starts again reads every registration from residency.json, each model cold.
    gateway.stop()
    gateway.ensure_running()
    held = gateway.residency()["models"]
    assert len(held) == 2000 and "many_0000" not in held and held["one_more"]["cold_start_timeout"] == 7
    assert {entry["state"] for entry in held.values()} == {"cold"}


def long_poll(gateway, wait: float) -> tuple[list[str], float]:
    """The loader's long poll as sent raw: the models it answers and its X-Modelyard-Wanted-Age (seconds)."""
    connection = _UnixConnection(gateway.control_socket, wait + 5)
    try:
        connection.request("GET", f"/residency/wanted?wait={wait:g}")
        answer = connection.getresponse()
        return json.loads(answer.read()), float(answer.headers.get("X-Modelyard-Wanted-Age", "nan"))
    finally:
        connection.close()


def test_the_loaders_long_poll_wakes_when_a_model_is_wanted_not_at_its_next_check(tmp_path):
    # One worker, so the held request and the long poll share it: the want wakes the poll itself. The age is
    # measured by nginx's clock (milliseconds): a poll that checked every 2 ms saw most wants 1-2 ms late.
    gateway = TritonGateway(tmp_path / "gateway", free_port(), triton=f"127.0.0.1:{free_port()}",
                            listen_host="127.0.0.1", workers="1")
    gateway.ensure_running()
    cold = [f"cold_{i:02d}" for i in range(20)]
    settings = {"pinned": False, "cold_start_timeout": 1.0, "max_held": 4}
    gateway.residency_file.write_text(json.dumps({"models": {name: settings for name in NAMES + cold}}))
    gateway.resync_residency()
    ages = []
    try:
        with ThreadPoolExecutor(len(cold) + 1) as pool:
            for name in cold:
                poll = pool.submit(long_poll, gateway, 5.0)
                time.sleep(0.05)  # the poll is waiting
                pool.submit(infer_status, gateway, name)  # held until its 1-s timeout: no loader loads it
                models, age = poll.result()
                assert models == [name]
                ages.append(age)
    finally:
        gateway.stop()
    assert statistics.median(ages) == 0 and sum(age >= 0.002 for age in ages) <= 2, ages
