"""Concurrent on-demand loads (``--concurrent-loads``, ``OnDemandLoader(concurrent_loads=...)``) on a real Triton
behind a real gateway: with 2, two cold models wanted at once load at the same time (with the default 1, one
after the other); a model whose footprint is not measured yet loads alone; and room is made and reserved in one
step, so two loads under way never hold more than the budget between them."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from modelyard_agent.runtimes.triton import TritonRuntime
from tests.deployments.test_gateway import BODY
from tests.fixtures.on_demand import MB, put_model

pytestmark = pytest.mark.integration


@pytest.fixture
def host(make_host, triton_server):
    """A gateway in front of the session's shared Triton."""
    return make_host(triton_server)


def infer(gateway, model: str) -> int:
    return requests.post(f"{gateway.url}/v2/models/{model}/infer", json=BODY, timeout=90).status_code


def overlap(first: tuple[float, float], second: tuple[float, float]) -> bool:
    return first[0] < second[1] and second[0] < first[1]


def both_at_once(host, *models: str) -> list[int]:
    with ThreadPoolExecutor(len(models)) as pool:
        return list(pool.map(lambda model: infer(host, model), models))


@pytest.mark.parametrize("concurrent", [1, 2])
def test_two_cold_models_wanted_at_once_load_together_only_when_two_loads_may_run(host, concurrent):
    models = [f"cl{concurrent}_a", f"cl{concurrent}_b"]
    for name in models:
        put_model(host.server, name, load_seconds=2)
        host.register_on_demand(name, cold_start_timeout=60, footprint_bytes=100 * MB)
    loader = host.start_loader(budget_bytes=None, concurrent_loads=concurrent)
    assert both_at_once(host, *models) == [200, 200]
    (first,), (second,) = (loader.runtime.intervals[name] for name in models)
    assert overlap(first, second) is (concurrent == 2), (first, second)


def test_a_model_not_measured_yet_loads_alone(host):
    put_model(host.server, "cl_unmeasured", load_seconds=2)
    host.register_on_demand("cl_unmeasured", cold_start_timeout=60)  # no footprint: its load measures it
    put_model(host.server, "cl_measured", load_seconds=2)
    host.register_on_demand("cl_measured", cold_start_timeout=60, footprint_bytes=100 * MB)
    loader = host.start_loader(budget_bytes=None, concurrent_loads=2)
    assert both_at_once(host, "cl_unmeasured", "cl_measured") == [200, 200]
    (unmeasured,), (measured,) = (loader.runtime.intervals[name] for name in ("cl_unmeasured", "cl_measured"))
    assert not overlap(unmeasured, measured), (unmeasured, measured)


def test_two_loads_under_way_reserve_their_room_so_the_budget_is_never_overcommitted(host):
    # Room for two and a half: "resident" is loaded first; then two cold models are wanted at once. The first
    # fits beside it; the second fits only once "resident" leaves, because the first load's bytes are reserved
    # (counted without them, it would fit too, and three would be READY at once: 300 MB in 250).
    names = ("cr_resident", "cr_a", "cr_b")
    for name in names:
        put_model(host.server, name, load_seconds=0 if name == "cr_resident" else 3)
        host.register_on_demand(name, cold_start_timeout=60, footprint_bytes=100 * MB)
    loader = host.start_loader(budget_bytes=250 * MB, concurrent_loads=2)
    assert infer(host, "cr_resident") == 200
    runtime, most, stop = TritonRuntime(host.server.http_url), [0], threading.Event()

    def watch():
        while not stop.is_set():
            ready = {e.name for e in runtime.repository_index() if e.state == "READY"} & set(names)
            most[0] = max(most[0], len(ready))
            stop.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert both_at_once(host, "cr_a", "cr_b") == [200, 200]
    finally:
        stop.set()
        watcher.join()
    assert most[0] <= 2, f"{most[0]} of 100 MB READY at once in a budget of 250 MB"
    (a,), (b,) = (loader.runtime.intervals[name] for name in ("cr_a", "cr_b"))
    assert overlap(a, b), (a, b)  # and the two loads did run at once
