"""Models on demand on a GPU host, on a real Triton behind a real gateway, with Triton's memory gauges from the
recorded two-GPU exposition (``tests/fixtures/data/triton_gpu_metrics.txt``, served over HTTP; there is no GPU on
this machine) changed the way a load changes them: a load is measured on the GPU whose memory rose once Triton's
metrics interval has passed, a load that raised no GPU's memory in CPU memory, and room on one GPU is made by
evicting a model on that GPU, never one on another; the budget's report gives the bytes held on each device."""

import json
import time

import pytest
import requests

from modelyard_agent.runtimes.triton import TritonRuntime
from tests.deployments.test_gateway import BODY
from tests.fixtures.expositions import EXPOSITIONS, GPU_A, GPU_B, triton_gpu_exposition
from tests.fixtures.on_demand import MB, put_model
from tests.fixtures.services import wait_for

pytestmark = pytest.mark.integration

GB = 1 << 30


@pytest.fixture
def host(make_host, triton_server):
    """A gateway in front of the session's shared Triton."""
    return make_host(triton_server)


def infer(gateway, model: str, timeout: float = 60) -> requests.Response:
    return requests.post(f"{gateway.url}/v2/models/{model}/infer", json=BODY, timeout=timeout)


def ready_models(server) -> set[str]:
    return {e.name for e in TritonRuntime(server.http_url).repository_index() if e.state == "READY"}


def evictions(gateway, model: str) -> float:
    text = requests.get(f"{gateway.url}/metrics", timeout=10).text
    prefix = f'modelyard_evictions_total{{model="{model}",'
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_load_is_measured_on_the_gpu_whose_gauge_rose_once_tritons_metrics_interval_has_passed(
        host, serve_exposition):
    put_model(host.server, "gpu_late")
    host.register_on_demand("gpu_late", cold_start_timeout=30)
    served = serve_exposition(EXPOSITIONS["triton_gpu"])
    base, raised = served.text(), triton_gpu_exposition(gpu_rise={GPU_B: 3 * GB})
    loader = host.start_loader(budget_bytes=16 * GB, metrics_url=served.url, metrics_interval_ms=800)

    def gauges() -> str:
        # Triton refreshes its gauges every 800 ms: the refresh that shows the load comes 700 ms after it ended.
        loads = loader.runtime.intervals.get("gpu_late")
        return raised if loads and time.monotonic() >= loads[0][1] + 0.7 else base

    served.set_text(gauges)
    answer = infer(host, "gpu_late")
    assert answer.status_code == 200, answer.text
    # The held requests were served at once; the footprint is read after the interval, from GPU B's gauge alone
    # (read at once, it would be 0 on both GPUs, and Triton's processes' own memory would be taken for it).
    assert loader.footprint("gpu_late") is None
    wait_for(lambda: loader.footprint("gpu_late") is not None, timeout=10, what="gpu_late measured")
    assert loader.footprint("gpu_late") == {GPU_B: 3 * GB}
    assert json.loads((host.dir / "footprints.json").read_text()) == {"gpu_late/*": {GPU_B: 3 * GB}}
    wait_for(lambda: host.residency()["budget"].get("devices") == {GPU_B: 3 * GB}, timeout=10,
             what="the budget's report with GPU B's bytes")
    assert host.residency()["budget"]["resident_bytes"] == 3 * GB


def test_a_model_whose_load_raised_no_gpu_is_measured_in_cpu_memory_on_a_gpu_host(host, serve_exposition):
    put_model(host.server, "cpu_on_gpu_host")
    host.register_on_demand("cpu_on_gpu_host", cold_start_timeout=30)
    served = serve_exposition(EXPOSITIONS["triton_gpu"])  # neither GPU's memory moves
    loader = host.start_loader(budget_bytes=16 * GB, metrics_url=served.url, metrics_interval_ms=200)
    assert infer(host, "cpu_on_gpu_host").status_code == 200
    wait_for(lambda: loader.footprint("cpu_on_gpu_host") is not None, timeout=10, what="cpu_on_gpu_host measured")
    measured = loader.footprint("cpu_on_gpu_host")
    # What Triton's processes (the python backend's stub) hold more, as on a host without GPUs.
    assert set(measured) == {"cpu"} and measured["cpu"] > 1 << 20, measured
    assert loader.problem is None


def test_room_on_gpu_a_is_made_by_evicting_the_model_on_gpu_a_not_the_least_asked_one_on_gpu_b(host):
    # Measured earlier on this host: one model on each GPU, and a larger one on GPU A.
    footprints = {"dev_b": {GPU_B: 100 * MB}, "dev_a": {GPU_A: 100 * MB}, "dev_a_large": {GPU_A: 200 * MB}}
    (host.dir / "footprints.json").write_text(json.dumps({f"{name}/*": f for name, f in footprints.items()}))
    for name in footprints:
        put_model(host.server, name)
        host.register_on_demand(name, cold_start_timeout=30)
    host.start_loader(budget_bytes=250 * MB, metrics_url="")  # on each device
    assert infer(host, "dev_b").status_code == 200  # asked once: the first victim by demand
    for _ in range(3):
        assert infer(host, "dev_a").status_code == 200
    assert infer(host, "dev_a_large").status_code == 200
    # GPU A cannot hold dev_a beside dev_a_large (300 MiB): dev_a leaves, and dev_b, which frees nothing on GPU A,
    # stays however little it is asked.
    wait_for(lambda: "dev_a" not in ready_models(host.server), timeout=30, what="dev_a evicted")
    assert "dev_b" in ready_models(host.server)
    assert evictions(host, "dev_a") >= 1 and evictions(host, "dev_b") == 0
    budget = host.residency()["budget"]
    assert budget["budget_bytes"] == 250 * MB and budget["devices"][GPU_B] == 100 * MB, budget
    assert budget["devices"][GPU_A] <= 250 * MB, budget
    text = requests.get(f"{host.url}/metrics", timeout=10).text
    assert f'modelyard_device_resident_bytes{{device="{GPU_B}"}} {100 * MB}' in text
