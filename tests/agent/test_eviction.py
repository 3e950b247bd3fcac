"""The on-demand eviction policy alone (``modelyard_agent.eviction``): demand decays with its half-life, the order
is least demand then least recent use, a restarted counter counts whole, and on a Zipf trace with a burst of rare
models it keeps the popular ones that LRU loses (``bench/on_demand.py`` runs the same simulation beside LRU and
Belady's optimum on its own trace); room a load needs on one GPU is made by evicting models on that GPU only."""

import random
import sys
from pathlib import Path

import pytest

from modelyard_agent.eviction import (
    ANY_DEVICE,
    DEMAND_HALF_LIFE_SECONDS,
    DemandPolicy,
    room_victims,
    simulate_hits,
    too_large,
)
from tests.fixtures.expositions import GPU_A, GPU_B

GB = 1 << 30

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from on_demand import belady_hits, lru_hits, zipf_trace  # noqa: E402 - the benchmark's own trace and baselines


def test_a_request_counts_half_after_one_half_life_and_the_least_demanded_goes_first():
    policy = DemandPolicy()
    policy.observe({"old": 4, "new": 0}, now=0.0)
    policy.observe({"old": 4, "new": 3}, now=DEMAND_HALF_LIFE_SECONDS)
    assert policy.score("old", DEMAND_HALF_LIFE_SECONDS) == pytest.approx(2.0)
    assert policy.score("new", DEMAND_HALF_LIFE_SECONDS) == pytest.approx(3.0)
    assert policy.victims(["new", "old"], {}, now=DEMAND_HALF_LIFE_SECONDS) == ["old", "new"]
    # Scores are compared at one time, whenever each model was last observed.
    assert policy.score("old", 3 * DEMAND_HALF_LIFE_SECONDS) == pytest.approx(0.5)
    assert policy.score("never", 10.0) == 0.0


def test_equal_demand_goes_least_recently_used_first_and_a_never_used_model_before_any():
    policy = DemandPolicy()
    policy.observe({"a": 1, "b": 1, "c": 1}, now=5.0)
    assert policy.victims({"a", "b", "c"}, {"a": 30.0, "b": 10.0, "c": None}, now=5.0) == ["c", "b", "a"]


def test_a_counter_that_restarted_counts_whole():
    policy = DemandPolicy()
    policy.observe({"m": 10}, now=0.0)
    policy.observe({"m": 2}, now=0.0)  # the gateway restarted and counted 2 since
    assert policy.score("m", 0.0) == pytest.approx(12.0)


def test_on_a_zipf_trace_with_a_burst_of_rare_models_it_keeps_the_popular_ones_lru_loses():
    models = [f"m{i:03d}" for i in range(100)]
    trace = zipf_trace(models, 6000, 1.0, seed=11)
    burst = sorted(models, key=trace.count)[:30]
    random.Random(3).shuffle(burst)
    trace = trace[:3000] + burst + trace[3000:]  # a scan of the models least asked, in the middle
    times = [i * 0.5 for i in range(len(trace))]
    capacity = 15
    ours = simulate_hits(DemandPolicy(), trace, capacity, times)
    lru, belady = lru_hits(trace, capacity), belady_hits(trace, capacity)
    assert lru < ours <= belady, (lru, ours, belady)  # 2,934 < 3,772 <= 4,214 hits of 6,030 when written


def test_room_on_gpu_a_is_made_by_evicting_a_model_on_gpu_a_never_one_on_gpu_b():
    held = {"on_b": {GPU_B: 40 * GB}, "on_a": {GPU_A: 30 * GB}, "both": {GPU_A: 10 * GB, GPU_B: 10 * GB}}
    policy = DemandPolicy()
    policy.observe({"on_b": 1, "both": 5, "on_a": 9}, now=0.0)
    order = policy.victims(held, {}, now=0.0)
    assert order == ["on_b", "both", "on_a"]  # by demand alone, on_b would go first
    budget = 60 * GB
    # GPU A holds 40 GiB: a 30 GiB load there needs 10 GiB of it back; on_b holds none.
    assert room_victims({GPU_A: 30 * GB}, held, order, budget) == ["both"]
    assert room_victims({GPU_A: 45 * GB}, held, order, budget) == ["both", "on_a"]
    # A load on GPU B (50 + 10 GiB) fits as things are; one larger than a device can never fit.
    assert room_victims({GPU_B: 10 * GB}, held, order, budget) == []
    assert room_victims({GPU_A: 61 * GB}, held, order, budget) is None and too_large({GPU_A: 61 * GB}, budget)
    # A model whose device is not known counts on every device, so evicting it frees room on GPU A too.
    assert room_victims({GPU_A: 30 * GB}, {**held, "legacy": {ANY_DEVICE: 5 * GB}}, ["legacy", *order],
                        budget) == ["legacy", "both"]
