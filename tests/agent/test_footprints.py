"""Footprints per device (``modelyard_agent.footprints``), read from the recorded two-GPU Triton exposition served
over HTTP and changed between the readings before and after a load: the rise is read per GPU, once Triton's
metrics interval has passed since the load; a load that raised no GPU's memory is measured in CPU memory; a
footprint kept as one figure counts on every device."""

import json
import time
from types import SimpleNamespace

import pytest

from modelyard_agent.eviction import ANY_DEVICE, CPU_DEVICE, overdrawn
from modelyard_agent.footprints import (
    FootprintAccounts,
    as_footprint,
    footprint_key,
    forget_footprint,
    keep_footprint,
    memory_rise,
    version_footprints,
)
from modelyard_agent.runtimes.triton import read_memory_in_use
from tests.fixtures.expositions import EXPOSITIONS, GPU_A, GPU_B, triton_gpu_exposition

MB, GB = 1 << 20, 1 << 30


class Accounts(FootprintAccounts):
    """A loader's accounts alone: registrations and footprints in ``directory``, Triton's gauges at
    ``metrics_url``, refreshed every ``interval`` seconds."""

    def __init__(self, directory, metrics_url="", *, budget=None, interval=2.0, registered=(), measured=None):
        # No request held or in flight: a measurement reads at once.
        self.gateway = SimpleNamespace(residency_file=directory / "residency.json",
                                       residency=lambda: {"models": {}}, inflight=dict)
        self.gateway.residency_file.write_text(json.dumps({"models": {m: {} for m in registered}}))
        self.footprints_file = directory / "footprints.json"
        if measured is not None:
            self.footprints_file.write_text(json.dumps(measured))
        self.runtime = SimpleNamespace(inference_url="http://127.0.0.1:9")
        self.budget, self.metrics_url, self.metrics_interval = budget, metrics_url, interval
        self.memory_changed_at, self.problem, self._reserved = float("-inf"), None, {}


@pytest.fixture
def triton_out_of_sight(monkeypatch):
    """Triton's processes not visible to the agent (another machine, a container): only its gauges are read."""
    monkeypatch.setattr("modelyard_agent.footprints.triton_resident_bytes", lambda url: None)


def test_a_load_is_measured_on_each_gpu_whose_used_memory_rose(serve_exposition):
    served = serve_exposition(EXPOSITIONS["triton_gpu"])
    before = (read_memory_in_use(served.url), None)
    # GPU B took 3 GiB; the machine's CPU gauge moved too, which a GPU model's footprint leaves out.
    served.set_text(triton_gpu_exposition(gpu_rise={GPU_B: 3 * GB}, cpu_rise=200 * MB))
    assert memory_rise(before, (read_memory_in_use(served.url), None)) == {GPU_B: 3 * GB}
    # A model with an instance on each GPU holds memory on both.
    served.set_text(triton_gpu_exposition(gpu_rise={GPU_A: 1 * GB, GPU_B: 2 * GB}))
    assert memory_rise(before, (read_memory_in_use(served.url), None)) == {GPU_A: 1 * GB, GPU_B: 2 * GB}


def test_a_load_that_raised_no_gpu_is_measured_in_cpu_memory_on_a_gpu_host(serve_exposition):
    served = serve_exposition(EXPOSITIONS["triton_gpu"])
    gauges_before = read_memory_in_use(served.url)
    served.set_text(triton_gpu_exposition(cpu_rise=300 * MB))  # neither GPU moved
    gauges_after = read_memory_in_use(served.url)
    # Triton's processes in sight: what they hold more.
    assert memory_rise((gauges_before, 700 * MB), (gauges_after, 820 * MB)) == {CPU_DEVICE: 120 * MB}
    # Out of sight: Triton's CPU gauge.
    assert memory_rise((gauges_before, None), (gauges_after, None)) == {CPU_DEVICE: 300 * MB}
    # Nothing rose anywhere: not measured (never 0 bytes).
    assert memory_rise((gauges_before, None), (gauges_before, None)) is None


def test_the_reading_after_a_load_waits_until_tritons_metrics_interval_has_passed(serve_exposition, tmp_path,
                                                                                 triton_out_of_sight):
    served = serve_exposition(EXPOSITIONS["triton_gpu"])
    accounts = Accounts(tmp_path, served.url, interval=0.5, registered=["late"])
    before = accounts._memory()
    accounts.memory_changed_at = ended = time.monotonic()  # the load ends now
    # Triton refreshes its gauges every 0.5 s; the refresh that shows the load comes 0.4 s after it ended.
    base, raised = served.text(), triton_gpu_exposition(gpu_rise={GPU_A: 2 * GB})
    served.set_text(lambda: raised if time.monotonic() >= ended + 0.4 else base)
    assert accounts._measure("late", before) == {GPU_A: 2 * GB}
    assert time.monotonic() - ended >= 0.5
    assert json.loads(accounts.footprints_file.read_text()) == {"late/*": {GPU_A: 2 * GB}}
    assert accounts.footprint("late") == {GPU_A: 2 * GB}


def test_a_load_that_added_nothing_visible_says_the_budget_is_not_enforceable(serve_exposition, tmp_path,
                                                                              triton_out_of_sight):
    served = serve_exposition(EXPOSITIONS["triton_gpu"])
    accounts = Accounts(tmp_path, served.url, budget=8 * GB, interval=0.0, registered=["unseen"])
    assert accounts._measure("unseen", accounts._memory()) is None
    assert accounts.problem.startswith("budget not enforceable as measured: the load of unseen added no memory")
    assert accounts._budget_report({"unseen"})["problem"] == accounts.problem


def test_a_load_is_not_measured_from_triton_processes_alone_when_its_metrics_cannot_be_read(
        serve_exposition, tmp_path, monkeypatch):
    # Triton's processes hold 50 MiB more after the load, but its GPU gauges were not read: on a GPU host that is
    # the model's host memory, not its footprint, which is on a GPU the agent cannot see.
    served = serve_exposition(EXPOSITIONS["triton_gpu"])
    resident = iter([700 * MB, 750 * MB])
    monkeypatch.setattr("modelyard_agent.footprints.triton_resident_bytes", lambda url: next(resident))
    accounts = Accounts(tmp_path, served.url, budget=8 * GB, interval=0.0, registered=["blind"])
    before = accounts._memory()
    served.stop()
    assert accounts._measure("blind", before) is None
    assert accounts.problem.startswith(f"budget not enforceable as measured: Triton's metrics ({served.url}) could "
                                       "not be read around the load of blind")
    assert not accounts.footprints_file.exists()


def test_a_footprint_kept_as_one_figure_counts_on_every_device(tmp_path):
    # "old" was measured by an agent that kept one figure per model; "declared" comes with its deployment.
    accounts = Accounts(tmp_path, budget=8 * GB, registered=["old", "on_a", "cpu_model", "idle_b"],
                        measured={"old": 5 * GB, "on_a/*": {GPU_A: 2 * GB}, "cpu_model/*": {CPU_DEVICE: 1 * GB},
                                  "idle_b/*": {GPU_B: 4 * GB}})
    assert accounts.footprint("old") == {ANY_DEVICE: 5 * GB}
    assert as_footprint(None) is None and as_footprint({GPU_A: 0}) is None and as_footprint("junk") is None
    report = accounts._budget_report({"old", "on_a", "cpu_model"})
    # Every device a footprint names is reported, idle_b's GPU B too, with "old" counted on each of them.
    assert report == {"budget_bytes": 8 * GB, "resident_bytes": 7 * GB, "problem": None,
                      "devices": {CPU_DEVICE: 6 * GB, GPU_A: 7 * GB, GPU_B: 5 * GB}}
    # A 2 GiB load on GPU A passes its budget there (7 + 2 > 8); one on GPU B (5 + 2) fits.
    held = accounts._held({"old", "on_a", "cpu_model"}).values()
    assert overdrawn(held, {GPU_A: 2 * GB}, 8 * GB) == {GPU_A: 9 * GB}
    assert overdrawn(held, {GPU_B: 2 * GB}, 8 * GB) == {}


def test_a_footprint_is_kept_per_version_and_a_new_version_is_measured_again(tmp_path):
    accounts = Accounts(tmp_path, registered=["iris"])
    registrations = accounts.gateway.residency_file

    def register(versions):
        registrations.write_text(json.dumps({"models": {"iris": {"versions": versions}}}))

    register([1])
    keep_footprint(accounts.footprints_file, footprint_key("iris", [1]), {CPU_DEVICE: 300 * MB})
    assert accounts.footprint("iris") == {CPU_DEVICE: 300 * MB} and accounts.measured("iris")
    # Version 2 replaces it: not measured (its load is measured, alone), and never counted as version 1's 300 MiB.
    register([2])
    assert accounts.footprint("iris") is None and not accounts.measured("iris")
    # A canary keeps both loaded: what the two hold together is kept apart from either.
    register([1, 2])
    assert footprint_key("iris", [2, 1]) == "iris/1+2" and not accounts.measured("iris")
    # Back to version 1 (a rollback): its measurement counts again.
    register([1])
    assert accounts.footprint("iris") == {CPU_DEVICE: 300 * MB}
    assert version_footprints(tmp_path) == {"iris/1": {CPU_DEVICE: 300 * MB}}
    # Deploying version 1 again (maybe with another config) forgets only its own figure.
    keep_footprint(accounts.footprints_file, footprint_key("iris", [2]), {CPU_DEVICE: 400 * MB})
    forget_footprint(tmp_path, "iris", [1])
    assert version_footprints(tmp_path) == {"iris/2": {CPU_DEVICE: 400 * MB}}


def test_a_footprint_an_older_agent_kept_per_model_counts_on_every_device_until_the_version_is_measured(tmp_path):
    accounts = Accounts(tmp_path, budget=8 * GB, measured={"old": {GPU_A: 2 * GB, CPU_DEVICE: 1 * GB}})
    accounts.gateway.residency_file.write_text(json.dumps({"models": {"old": {"versions": [3]}}}))
    # Of a version not known: its most on one device, on every device, and the load of version 3 is measured.
    assert accounts.footprint("old") == {ANY_DEVICE: 2 * GB} and not accounts.measured("old")
    assert version_footprints(tmp_path) == {}  # no version to report it for
    keep_footprint(accounts.footprints_file, footprint_key("old", [3]), {GPU_B: 1 * GB})
    assert json.loads(accounts.footprints_file.read_text()) == {"old/3": {GPU_B: 1 * GB}}
    assert accounts.footprint("old") == {GPU_B: 1 * GB} and accounts.measured("old")
