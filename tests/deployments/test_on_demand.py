"""Models on demand on a real Triton behind a real gateway: a request for a model that is not resident is
held until the agent's loader has loaded it; the loader evicts the least recently used within its memory
budget, never a pinned model; failures, timeouts and a missing loader are answered 503 with Retry-After."""

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from modelyard_agent.footprints import triton_resident_bytes
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.triton import TritonRuntime
from tests.deployments.test_gateway import BODY
from tests.fixtures.on_demand import MB, put_model
from tests.fixtures.services import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def host(make_host, triton_server):
    """A gateway in front of the session's shared Triton."""
    return make_host(triton_server)


def infer(gateway, model: str, timeout: float = 60) -> requests.Response:
    return requests.post(f"{gateway.url}/v2/models/{model}/infer", json=BODY, timeout=timeout)


def samples(gateway, name: str) -> dict[tuple, float]:
    text = requests.get(f"{gateway.url}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name.startswith(name)}


def ready_models(server) -> set[str]:
    return {e.name for e in TritonRuntime(server.http_url).repository_index() if e.state == "READY"}


def test_many_requests_for_a_cold_model_start_one_load_and_are_all_answered(host, caplog):
    caplog.set_level(logging.INFO, logger="modelyard_agent.loads")
    put_model(host.server, "cold_a")
    host.register_on_demand("cold_a", cold_start_timeout=60)
    loader = host.start_loader()
    assert "cold_a" not in ready_models(host.server)
    sent = time.time()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: infer(host, "cold_a"), range(16)))
    assert [a.status_code for a in answers] == [200] * 16, [a.text for a in answers if a.status_code != 200]
    assert all(float(a.headers["X-Modelyard-Cold-Start"]) > 0 for a in answers)
    assert loader.runtime.loads == {"cold_a": 1}
    assert host.residency()["models"]["cold_a"]["state"] == "resident"
    hit = infer(host, "cold_a")
    assert hit.status_code == 200 and "X-Modelyard-Cold-Start" not in hit.headers  # now a hit
    # A request that names its version is held the same way, and needs no load once resident.
    named = requests.post(f"{host.url}/v2/models/cold_a/versions/1/infer", json=BODY, timeout=30)
    assert named.status_code == 200 and named.json()["model_version"] == "1"
    seen = samples(host, "modelyard_")
    assert seen[("modelyard_on_demand_requests_total", (("model", "cold_a"), ("outcome", "cold")))] == 16
    assert seen[("modelyard_on_demand_requests_total", (("model", "cold_a"), ("outcome", "hit")))] == 2
    assert seen[("modelyard_cold_start_seconds_count", (("model", "cold_a"),))] == 16
    # One load, in seconds as Triton took it; the held requests waited about that long each (and a little more).
    loaded = (("model", "cold_a"), ("outcome", "loaded"))
    assert seen[("modelyard_model_load_seconds_count", loaded)] == 1
    load = seen[("modelyard_model_load_seconds_sum", loaded)]
    assert 0 < load < seen[("modelyard_cold_start_seconds_sum", (("model", "cold_a"),))] / 16 + 0.5
    # The loader's record of that load says when it ran (modelyard_agent.loads): within the requests' hold, as
    # long as the histogram's figure, so a cold wait can be told apart from the load it waited for.
    records = [r.args for r in caplog.records if r.name == "modelyard_agent.loads"]
    assert [r[:3] for r in records] == [("load", "cold_a", "done")]
    started, ended, seconds = records[0][3:]
    assert sent <= started < ended <= time.time() and abs(seconds - load) < 0.05, (records, load)
    assert all(float(a.headers["X-Modelyard-Cold-Start"]) >= ended - started - 0.01 for a in answers)
    assert seen[("modelyard_on_demand_models", (("state", "resident"),))] == 1
    # The footprint was measured at the first load, once it was reported resident (no GPU here: what Triton's
    # processes hold more, in CPU memory) and kept.
    wait_for(lambda: loader.footprint("cold_a") is not None, timeout=10, what="cold_a measured")
    measured = loader.footprint("cold_a")
    assert set(measured) == {"cpu"} and measured["cpu"] > 1 << 20, measured
    # Kept for the versions it was registered with; registered with none named, under "*".
    assert json.loads((host.dir / "footprints.json").read_text()) == {"cold_a/*": measured}


def test_the_budget_evicts_the_least_asked_keeps_room_for_the_next_load_and_never_a_pinned_model(host, caplog):
    caplog.set_level(logging.INFO, logger="modelyard_agent.loads")
    for name in ("lru_pinned", "lru_b", "lru_c"):
        put_model(host.server, name)
        host.register_on_demand(name, pinned=name == "lru_pinned", footprint_bytes=100 * MB)
    host.start_loader(budget_bytes=350 * MB)  # three models and a half
    assert infer(host, "lru_pinned").status_code == 200  # asked once: the least, but pinned
    for _ in range(3):
        assert infer(host, "lru_b").status_code == 200
    assert infer(host, "lru_c").status_code == 200  # fits beside them: nothing leaves before it loads
    # Between loads the loader keeps one footprint free: lru_c, asked least of those that may leave, goes.
    wait_for(lambda: ready_models(host.server) & {"lru_pinned", "lru_b", "lru_c"} == {"lru_pinned", "lru_b"},
             timeout=20, what="lru_c evicted to keep room for the next load")
    assert infer(host, "lru_c").status_code == 200  # back on demand
    seen = samples(host, "modelyard_")
    assert seen[("modelyard_evictions_total", (("model", "lru_c"), ("reason", "budget")))] >= 1
    assert not any(key[0] == "modelyard_evictions_total" and ("model", "lru_pinned") in key[1] for key in seen)
    assert not any(key[0] == "modelyard_evictions_total" and ("model", "lru_b") in key[1] for key in seen)
    assert seen[("modelyard_memory_budget_bytes", ())] == 350 * MB
    assert seen[("modelyard_resident_bytes", ())] <= 350 * MB
    # Each eviction has its record beside the loads' (when the unload began and its versions were gone).
    records = [r.args for r in caplog.records if r.name == "modelyard_agent.loads"]
    assert ("eviction", "lru_c", "done") in [r[:3] for r in records], records
    assert all(r[3] < r[4] for r in records)


def test_no_room_is_a_503_and_never_an_overcommitted_host(host):
    for name in ("room_pinned", "room_b"):
        put_model(host.server, name)
        host.register_on_demand(name, pinned=name == "room_pinned", footprint_bytes=100 * MB)
    host.start_loader(budget_bytes=150 * MB)
    pinned = infer(host, "room_pinned")
    assert pinned.status_code == 200, pinned.text
    refused = infer(host, "room_b")
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert refused.json()["reason"] == "load_failed" and "no room" in refused.json()["error"]
    assert "room_pinned" in refused.json()["error"]
    assert "room_b" not in ready_models(host.server)
    # Bigger than the whole budget: said so.
    put_model(host.server, "room_huge")
    host.register_on_demand("room_huge", footprint_bytes=200 * MB)
    huge = infer(host, "room_huge")
    assert huge.status_code == 503 and "more than this host's on-demand memory budget" in huge.json()["error"]


def test_a_failed_load_answers_503_naming_the_error_and_backs_off(make_host, start_triton):
    # A server of its own: a failed load leaves Triton not ready (strict readiness) for the next test.
    host = make_host(start_triton())
    put_model(host.server, "broken_a", broken=True)
    host.register_on_demand("broken_a")
    loader = host.start_loader()
    first = infer(host, "broken_a")
    assert first.status_code == 503, first.text
    body = first.json()
    assert body["reason"] == "load_failed" and "Triton could not load broken_a" in body["error"], body
    assert int(first.headers["Retry-After"]) >= 1
    # Within the backoff, requests are answered at once with the same error, and Triton is not asked again.
    again = infer(host, "broken_a")
    assert again.status_code == 503 and again.json()["error"] == body["error"]
    assert loader.runtime.loads == {"broken_a": 1}
    assert "broken_a" not in ready_models(host.server)
    # Past the backoff (1 s, then 2 s) the next request tries once more.
    time.sleep(1.2)
    assert infer(host, "broken_a").status_code == 503
    assert loader.runtime.loads == {"broken_a": 2}
    assert host.residency()["models"]["broken_a"]["failure"]["retry_after"] == 2
    # Each failed load counts in modelyard_model_load_seconds with outcome "failed", as long as Triton took.
    seen = samples(host, "modelyard_model_load_seconds")
    failed = (("model", "broken_a"), ("outcome", "failed"))
    assert seen[("modelyard_model_load_seconds_count", failed)] == 2
    assert 0 < seen[("modelyard_model_load_seconds_sum", failed)] < 60
    assert not any(dict(labels).get("outcome") == "loaded" for _, labels in seen), seen


def test_without_a_loader_held_requests_are_answered_at_once(host):
    put_model(host.server, "orphan_a")
    host.register_on_demand("orphan_a", cold_start_timeout=30)
    started = time.monotonic()
    answer = infer(host, "orphan_a")
    assert answer.status_code == 503 and answer.json()["reason"] == "no_loader"
    assert time.monotonic() - started < 5
    assert "Retry-After" in answer.headers


def test_past_its_cold_start_timeout_a_held_request_gets_503(host):
    put_model(host.server, "slow_a")
    host.register_on_demand("slow_a", cold_start_timeout=1, max_held=2)
    # A loader that polls (it is alive) but is busy with other work: the request waits out its timeout.
    polling = threading.Event()

    def poll():
        while not polling.is_set():
            host.wanted(wait=0.5)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        wait_for(lambda: host.wanted(wait=0) == [], timeout=5, what="the poller")
        with ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda _: infer(host, "slow_a"), range(3)))
    finally:
        polling.set()
        poller.join()
    reasons = sorted(a.json()["reason"] for a in answers)
    assert [a.status_code for a in answers] == [503] * 3
    # Two held (the queue's bound) until the timeout; the third refused at once.
    assert reasons == ["queue_full", "timeout", "timeout"], reasons
    timed_out = next(a for a in answers if a.json()["reason"] == "timeout")
    assert timed_out.headers["Retry-After"] == "1" and "cold-start timeout of 1 s" in timed_out.json()["error"]


def test_a_model_unloaded_behind_the_loaders_back_comes_back_at_its_next_request(host):
    put_model(host.server, "back_a")
    host.register_on_demand("back_a")
    loader = host.start_loader()
    assert infer(host, "back_a").status_code == 200
    TritonRuntime(host.server.http_url).unload("back_a")  # as a restarted Triton holds nothing
    wait_for(lambda: host.residency()["models"]["back_a"]["state"] == "cold", timeout=10, what="back_a cold")
    assert infer(host, "back_a").status_code == 200
    assert loader.runtime.loads == {"back_a": 2}


def test_a_footprint_counts_what_serving_the_held_requests_took_beside_the_load(host):
    # A model's first inference takes memory of its own (the python backend's buffers, onnxruntime's arena): a
    # footprint read as soon as the load ended missed it, and the resident memory passed the budget by that much
    # per model (bench/results/on_demand.md).
    put_model(host.server, "serve_a")
    host.register_on_demand("serve_a")
    loader = host.start_loader()
    before = triton_resident_bytes(host.server.http_url)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: infer(host, "serve_a"), range(4)))
    assert [a.status_code for a in answers] == [200] * 4
    wait_for(lambda: loader.footprint("serve_a") is not None, timeout=10, what="serve_a measured")
    grown = triton_resident_bytes(host.server.http_url) - before
    assert loader.footprint("serve_a")["cpu"] >= grown - 64 * 1024, (loader.footprint("serve_a"), grown)


LOADER_PROCESS = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from modelyard_agent.residency import OnDemandLoader
    from modelyard_agent.runtimes.gateway import TritonGateway
    from modelyard_agent.runtimes.triton import TritonRuntime
    gateway = TritonGateway(Path(sys.argv[1]), int(sys.argv[2]), triton=sys.argv[3].removeprefix("http://"))
    OnDemandLoader(gateway, TritonRuntime(sys.argv[3], load_timeout=120), budget_bytes=None,
                   state_dir=Path(sys.argv[4])).start()
    print("started", flush=True)
    time.sleep(3600)
""")


def test_held_requests_get_503_when_the_agent_is_killed_and_serving_resumes_after_its_restart(host, tmp_path):
    # A model whose load takes 8 s, so requests are held when the agent's process is SIGKILLed.
    put_model(host.server, "sleepy", load_seconds=8)
    put_model(host.server, "after_a")
    host.register_on_demand("sleepy", cold_start_timeout=60)
    host.register_on_demand("after_a", cold_start_timeout=60)

    def agent():
        process = subprocess.Popen([sys.executable, "-c", LOADER_PROCESS, str(host.dir), str(host.listen_port),
                                    host.server.http_url, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        assert process.stdout.readline().strip() == "started"
        return process

    process = agent()
    with ThreadPoolExecutor(4) as pool:
        held = [pool.submit(infer, host, "sleepy") for _ in range(4)]
        wait_for(lambda: host.residency()["models"]["sleepy"]["held"] == 4, timeout=10, what="4 held")
        killed = time.monotonic()
        process.kill()
        process.wait()
        answers = [future.result() for future in held]
    assert [a.status_code for a in answers] == [503] * 4
    assert {a.json()["reason"] for a in answers} == {"no_loader"}
    assert time.monotonic() - killed < 10  # the loader's staleness (3 s) and a poll, not the 60 s timeout
    process = agent()
    try:
        assert infer(host, "after_a").status_code == 200
        sleepy = infer(host, "sleepy", timeout=90)
        assert sleepy.status_code == 200, sleepy.text
    finally:
        process.kill()
        process.wait()


def test_the_gateway_exposes_residency_and_refuses_malformed_reports(host):
    host.register_on_demand("shown_a", pinned=True, cold_start_timeout=5, max_held=3)
    held = host.residency()["models"]["shown_a"]
    assert held == {"pinned": True, "state": "cold", "requests": 0, "held": 0, "last_used": None, "wanted": False,
                    "failure": None, "cold_start_timeout": 5, "max_held": 3}
    saved = json.loads((host.dir / "residency.json").read_text())
    assert saved["models"]["shown_a"] == {"pinned": True, "cold_start_timeout": 5.0, "max_held": 3}
    with pytest.raises(ValueError):
        host.register_on_demand("shown_a", cold_start_timeout=0)
    with pytest.raises(ServingRuntimeError, match="state must be"):
        host._control("PUT", {"model": "shown_a", "state": "sideways"}, path="/residency/state")
    # An nginx restarted from its files knows the registrations, every model cold until the loader says.
    host.report_residency("shown_a", "resident")
    host.stop()
    host.ensure_running()
    assert host.residency()["models"]["shown_a"]["state"] == "cold"
    # A model not registered passes untouched.
    assert host.unregister_on_demand("shown_a")["models"] == {}
    assert Path(host.dir / "residency.json").exists()
