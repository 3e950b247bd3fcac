"""Models on demand when something goes wrong, on a real Triton behind a real gateway, with a real Redis for the
per-model locks: the loader outlives its lock service going down and a model unregistered while a load waits
for room; an eviction never takes a model whose deployment holds its lock (every control taking 2,000 models:
test_gateway_controls_at_scale.py)."""

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from demo.iris import sample_input
from modelyard_agent.adapters.on_demand import model_locks, register_residency
from modelyard_agent.coordination import lock_key
from modelyard_agent.residency import OnDemandLoader
from modelyard_agent.runtimes.gateway import TritonGateway
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.deployments.test_gateway import BODY
from tests.deployments.test_gateway_worker_death import send_and_leave_open
from tests.fixtures.on_demand import MB, CountingRuntime, polling_without_loading, put_model
from tests.fixtures.services import free_port, wait_for

pytestmark = pytest.mark.integration

HOST = "on-demand-faults"


@pytest.fixture
def host(make_host, triton_server):
    """A gateway in front of the session's shared Triton."""
    return make_host(triton_server)


@pytest.fixture
def locks(restartable_redis):
    """The agent's per-model locks (``adapters.on_demand.model_locks``) in a Redis of this test's own, and a client
    of it for taking a lock as a deployment does."""
    client = redis.Redis.from_url(restartable_redis.url, socket_timeout=2, socket_connect_timeout=2)
    return model_locks(lambda model: client.lock(lock_key(HOST, model), timeout=60)), client


def infer(gateway, model: str, timeout: float = 60) -> requests.Response:
    return requests.post(f"{gateway.url}/v2/models/{model}/infer", json=BODY, timeout=timeout)


def ready_models(server) -> set[str]:
    return {e.name for e in TritonRuntime(server.http_url).repository_index() if e.state == "READY"}


def samples_of(text: str, name: str) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def evictions(gateway, model: str) -> float:
    text = requests.get(f"{gateway.url}/metrics", timeout=10).text
    prefix = f'modelyard_evictions_total{{model="{model}",'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_the_loader_outlives_its_lock_service_going_down_for_10_s(host, locks, restartable_redis):
    model_lock, _ = locks
    put_model(host.server, "redis_a")
    host.register_on_demand("redis_a", cold_start_timeout=20)
    loader = host.start_loader(model_lock=model_lock)
    restartable_redis.stop()
    down = time.monotonic()
    try:
        refused = infer(host, "redis_a")
        # The load fails at once, naming why, instead of ending the loading thread (every cold request would then
        # wait out its cold-start timeout until the agent restarts).
        assert refused.status_code == 503, refused.text
        assert refused.json()["reason"] == "load_failed", refused.json()
        assert "ConnectionError" in refused.json()["error"] and "redis_a" in refused.json()["error"]
        assert time.monotonic() - down < 10
        time.sleep(max(0.0, 10 - (time.monotonic() - down)))  # the outage itself, not a wait for a result
    finally:
        restartable_redis.start()
    # Past the backoff (1 s after one failure), the next request loads it.
    wait_for(lambda: infer(host, "redis_a").status_code == 200, timeout=20, what="redis_a served once Redis is back")
    assert loader.runtime.loads == {"redis_a": 1}
    assert all(thread.is_alive() for thread in loader._threads)


def test_a_model_unregistered_while_a_load_waits_for_room_leaves_the_loader_working(host):
    # busy_a (50 MB) and busy_c (100 MB) answer in 4 s each, so both are in flight when wait_b (100 MB) asks for
    # room in a budget of 160 MB; busy_a is unregistered during that wait. Routed, so they count in flight.
    for name, footprint in (("busy_a", 50), ("busy_c", 100), ("wait_b", 100)):
        put_model(host.server, name, infer_seconds=4 if name.startswith("busy") else 0)
        host.register_on_demand(name, footprint_bytes=footprint * MB, cold_start_timeout=15)
    for name in ("busy_a", "busy_c"):
        host.set_route(name, stable=1)
    loader = host.start_loader(budget_bytes=160 * MB)
    with ThreadPoolExecutor(3) as pool:
        slow = [pool.submit(infer, host, "busy_a")]
        wait_for(lambda: host.inflight().get("busy_a/1") == 1, timeout=30, what="busy_a in flight")
        slow.append(pool.submit(infer, host, "busy_c"))
        wait_for(lambda: host.inflight().get("busy_c/1") == 1, timeout=30, what="busy_c in flight")
        waiting = pool.submit(infer, host, "wait_b")
        wait_for(lambda: host.residency()["models"]["wait_b"]["held"] == 1, timeout=10, what="wait_b held")
        time.sleep(0.3)  # the loader is in its wait for room
        host.unregister_on_demand("busy_a")
        answer = waiting.result()
        assert [future.result().status_code for future in slow] == [200, 200]
    # The wait ends with room (busy_c done) or without (503 no room); never with the loader gone, which leaves
    # every cold request to wait out its timeout.
    assert answer.status_code == 200 or answer.json()["reason"] == "load_failed", answer.text
    assert all(thread.is_alive() for thread in loader._threads)
    wait_for(lambda: infer(host, "wait_b", timeout=30).status_code == 200, timeout=20, what="wait_b served")


def test_an_eviction_passes_over_a_model_whose_deployment_holds_its_lock(host, locks):
    model_lock, client = locks
    for name in ("locked_x", "idle_y"):
        put_model(host.server, name)
        host.register_on_demand(name, footprint_bytes=100 * MB)
    host.start_loader(budget_bytes=250 * MB, model_lock=model_lock)  # two models and room for one more
    first = infer(host, "locked_x")
    assert first.status_code == 200, first.text
    deployment = client.lock(lock_key(HOST, "locked_x"), timeout=60)
    assert deployment.acquire(blocking=False)  # a deployment of locked_x begins
    try:
        for _ in range(3):  # idle_y is asked more: locked_x is the first victim by demand
            assert infer(host, "idle_y").status_code == 200
        # Between loads the loader keeps 100 MB free: one of the two leaves, and it is not the locked one.
        wait_for(lambda: "idle_y" not in ready_models(host.server), timeout=30, what="idle_y evicted instead")
        assert "locked_x" in ready_models(host.server)
        assert evictions(host, "locked_x") == 0
    finally:
        deployment.release()


def test_a_request_to_an_on_demand_model_without_a_route_counts_in_flight_so_no_eviction_cuts_it(host):
    put_model(host.server, "unrouted_a", infer_seconds=3)
    host.register_on_demand("unrouted_a")
    loader = host.start_loader()
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(infer, host, "unrouted_a")
        wait_for(lambda: host.inflight().get("unrouted_a/*", 0) == 1, timeout=30, what="unrouted_a in flight")
        # The eviction waits for it (and gives up after its timeout), rather than unloading under it.
        assert loader.evict("unrouted_a", "budget", timeout=0.5) is False
        answer = slow.result()
    assert answer.status_code == 200, answer.text
    assert "unrouted_a" in ready_models(host.server)
    assert host.inflight().get("unrouted_a/*") == 0


def test_requests_that_name_versions_add_no_counter_per_number_sent(host):
    put_model(host.server, "named_a")
    host.register_on_demand("named_a")
    host.set_route("named_a", stable=1)
    host.start_loader()
    for version in range(1, 41):
        requests.post(f"{host.url}/v2/models/named_a/versions/{version}/infer", json=BODY, timeout=60)
    keys = {key for key in host._control("GET", path="/inflight") if key.startswith("named_a/")}
    # One counter for the routed version and one for the model alone, per nginx worker: not one per number.
    assert {key.split("/")[1] for key in keys} <= {"1", "*"}, keys


def test_a_model_whose_footprint_cannot_be_measured_counts_as_the_largest_not_as_0_bytes(host, monkeypatch):
    # Triton in a container of its own, without a metrics URL: the agent sees no memory rise (the shipped
    # docker-compose.yml). A fault injected by hand, since this machine always lets the agent see Triton.
    monkeypatch.setattr("modelyard_agent.footprints.triton_resident_bytes", lambda url: None)
    for name in ("known_a", "unseen_b", "known_c"):
        put_model(host.server, name)
        host.register_on_demand(name, **({} if name == "unseen_b" else {"footprint_bytes": 100 * MB}))
    loader = host.start_loader(budget_bytes=250 * MB, metrics_url="")
    for name in ("known_a", "unseen_b", "known_c"):
        assert infer(host, name).status_code == 200
    assert loader.footprint("unseen_b") is None
    # Three models of some 100 MB each never sit together in 250 MB.
    resident = ready_models(host.server) & {"known_a", "unseen_b", "known_c"}
    assert len(resident) <= 2, resident
    assert host.residency()["budget"]["resident_bytes"] <= 250 * MB


def test_a_model_whose_requests_all_gave_up_is_not_loaded(host):
    put_model(host.server, "slow_load", load_seconds=3)
    put_model(host.server, "gave_up")
    host.register_on_demand("slow_load", cold_start_timeout=30)
    host.register_on_demand("gave_up", cold_start_timeout=2)
    loader = host.start_loader()
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(infer, host, "slow_load")
        wait_for(lambda: loader.runtime.loads.get("slow_load") == 1, timeout=10, what="the load of slow_load")
        gave_up = infer(host, "gave_up")  # held behind that load (one at a time) past its timeout
        assert gave_up.status_code == 503 and gave_up.json()["reason"] == "timeout", gave_up.text
        assert slow.result().status_code == 200
    # The loader comes to gave_up's want once slow_load is in: nobody waits for it, so it is not loaded (a load
    # would evict models in use, for no one).
    wait_for(lambda: not host.residency()["models"]["gave_up"]["wanted"], timeout=10, what="gave_up's want to end")
    assert "gave_up" not in loader.runtime.loads and "gave_up" not in ready_models(host.server)
    # A request that comes later wants it anew.
    host.register_on_demand("gave_up", cold_start_timeout=30)
    assert infer(host, "gave_up").status_code == 200
    assert loader.runtime.loads["gave_up"] == 1


def test_a_client_that_leaves_while_held_gives_its_place_back_at_once(host):
    put_model(host.server, "left_a")
    host.register_on_demand("left_a", cold_start_timeout=30, max_held=1)
    with polling_without_loading(host) as stop_polling:
        client = send_and_leave_open(host, "left_a")
        wait_for(lambda: host.residency()["models"]["left_a"]["held"] == 1, timeout=10, what="left_a held")
        client.close()  # the client gives up
        wait_for(lambda: host.residency()["models"]["left_a"]["held"] == 0, timeout=5, what="its place given back")
        # The queue (one place) takes the next client: it waits, rather than being refused queue_full.
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(infer, host, "left_a")
            wait_for(lambda: host.residency()["models"]["left_a"]["held"] == 1, timeout=10, what="the next held")
            stop_polling.set()  # the loader dies: the held request is answered no_loader within a few seconds
            assert waiting.result().json()["reason"] == "no_loader"


def test_a_model_triton_dropped_on_its_own_is_held_and_loaded_from_the_next_request(host):
    put_model(host.server, "dropped_a")
    host.register_on_demand("dropped_a")
    loader = host.start_loader()
    assert infer(host, "dropped_a").status_code == 200
    TritonRuntime(host.server.http_url).unload("dropped_a")  # as a crashed backend: the agent did not do it
    # Sent at once, well within the agent's reconciliation (every 2 s): at most the first meets Triton's 503.
    answers = [infer(host, "dropped_a") for _ in range(3)]
    assert [a.status_code for a in answers[1:]] == [200, 200], [a.text for a in answers]
    assert loader.runtime.loads == {"dropped_a": 2}


def test_versions_named_in_requests_the_gateway_answers_itself_add_no_series(host):
    put_model(host.server, "series_a")
    host.register_on_demand("series_a", cold_start_timeout=5)
    host.set_route("series_a", stable=1)
    for version in range(1, 21):  # no loader: each is answered 503 no_loader by the gateway, never by Triton
        answer = requests.post(f"{host.url}/v2/models/series_a/versions/{version}/infer", json=BODY, timeout=30)
        assert answer.json()["reason"] == "no_loader"
    text = requests.get(f"{host.url}/metrics", timeout=10).text
    counted = {labels["version"]: value for name, labels, value in samples_of(text, "modelyard_gateway_requests_total")
               if labels["model"] == "series_a" and value}
    assert counted == {"": 20}, counted  # one series of refusals, none per number sent


def test_with_nothing_measurable_the_budget_is_reported_not_enforceable_and_still_holds(host, monkeypatch):
    # Triton out of the agent's sight and no metrics URL: nothing can be measured, and no deployment declared a
    # footprint. A model not measured then counts as the whole budget, so two never sit in it together.
    monkeypatch.setattr("modelyard_agent.footprints.triton_resident_bytes", lambda url: None)
    for name in ("blind_a", "blind_b"):
        put_model(host.server, name)
        host.register_on_demand(name)
    loader = host.start_loader(budget_bytes=500 * MB, metrics_url="")
    assert infer(host, "blind_a").status_code == 200
    assert infer(host, "blind_b").status_code == 200
    assert ready_models(host.server) & {"blind_a", "blind_b"} == {"blind_b"}
    # blind_b's load is measured (to nothing) once it is reported resident; the next report says so.
    wait_for(lambda: host.residency()["budget"]["problem"] == loader.problem, timeout=10, what="the problem reported")
    budget = host.residency()["budget"]
    assert budget["resident_bytes"] <= 500 * MB
    assert budget["problem"].startswith("budget not enforceable as measured"), budget


def test_a_deployment_makes_the_loader_measure_the_model_again(host, agent_settings, tmp_path):
    config = agent_settings(model_repository=tmp_path / "repository", staging_dir=tmp_path / "state")
    footprints = Path(config.staging_dir) / "footprints.json"
    footprints.parent.mkdir(parents=True)
    footprints.write_text(json.dumps({"redeployed": 5 * MB, "redeployed/2": 6 * MB, "redeployed/3": 8 * MB,
                                      "other/2": 7 * MB}))
    # Version 2 of "redeployed" is deployed on demand again, maybe with another config: what its earlier load
    # measured is stale, and so is what an older agent kept for the model as a whole; version 3's figure stays.
    register_residency(host, {"model": "redeployed", "residency": "on_demand", "footprint_bytes": None},
                       resident=False, versions=[2])
    assert json.loads(footprints.read_text()) == {"redeployed/3": 8 * MB, "other/2": 7 * MB}
    assert host.residency()["models"]["redeployed"]["state"] == "cold"


def test_a_grpc_call_that_names_its_model_is_held_loaded_and_counted_in_flight(triton_server, tmp_path):
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    gateway = TritonGateway(tmp_path / "gateway", free_port(), triton=triton_server.http_url.removeprefix("http://"),
                            listen_host="127.0.0.1", grpc_listen=f"127.0.0.1:{free_port()}",
                            triton_grpc=triton_server.grpc_url)
    gateway.ensure_running()
    put_model(triton_server, "grpc_a", infer_seconds=2)
    gateway.register_on_demand("grpc_a", cold_start_timeout=60)
    loader = OnDemandLoader(gateway, CountingRuntime(triton_server.http_url, load_timeout=120,
                                                     grpc_url=triton_server.grpc_url),
                            budget_bytes=None, state_dir=tmp_path / "state")
    assert loader.start()
    client = grpcclient.InferenceServerClient(gateway.grpc_listen)
    tensor = grpcclient.InferInput("input", [len(sample_input()), 4], "FP32")
    tensor.set_data_from_numpy(np.asarray(sample_input(), dtype=np.float32))
    try:
        # Without the header the gateway cannot tell the model: the call passes as sent, to Triton's own error.
        with pytest.raises(InferenceServerException):
            client.infer("grpc_a", [tensor])
        assert loader.runtime.loads == {}
        with ThreadPoolExecutor(1) as pool:
            call = pool.submit(client.infer, "grpc_a", [tensor], headers={"x-modelyard-model": "grpc_a"})
            wait_for(lambda: gateway.inflight().get("grpc_a/*") == 1, timeout=60, what="the gRPC call in flight")
            # An eviction waits for it (and gives up after its timeout), rather than unloading under it.
            assert loader.evict("grpc_a", "budget", timeout=0.3) is False
            answer = call.result()
        assert answer.as_numpy("label").shape[0] == len(sample_input())
        assert loader.runtime.loads == {"grpc_a": 1} and gateway.inflight().get("grpc_a/*") == 0
    finally:
        client.close()
        loader.stop()
        gateway.stop()
