"""Benchmark: models on demand, many more models registered on one Triton host than its memory budget holds.

What it runs, all real: one tritonserver (explicit model control, as the tests start it), the host's gateway
(nginx with its Lua modules) and the agent's on-demand loader (``modelyard_agent.residency``, the threads
``modelyard-agent`` runs beside its worker, here in this process), Triton reached over gRPC model control.

- ``--models`` (100) python-backend models (``bench/static_batch_model.py``), each holding a real FP32 weight
  matrix of ``--model-mib`` (32 MiB) drawn when it loads, all registered on demand with no footprint declared (the
  loader measures each at its first load), each with a route (so its requests are counted in flight), none loaded.
- The budget holds ``--budget-share`` (15 %) of them: ``floor(share × models)`` times the footprint the benchmark
  measured across its own bare loads and a first inference each (the rise of the resident memory of Triton's
  processes), and one pinned model beside them.
- The trace: Zipf(s = ``--zipf``) over the models, in a random order fixed by ``--seed``. Its rate is picked so
  that cold loads use ``--load-share`` (0.75) of the host's load capacity: LRU simulated offline on the same trace
  gives the miss ratio m; the bare load time L and unload time U (means of ``--load-samples`` loads from local
  disk and unloads, measured first in the same run) give the capacity 1 / (L + U) cold loads/s, since in a full
  budget each load evicts a model; the rate is share / ((L + U) × m) requests/s. Requests are sent on that
  schedule (open loop) for ``--duration`` seconds (600).
- The wait beyond the load: the loader records when each load and eviction started and ended
  (``modelyard_agent.loads``, read here through a log handler); each cold request's wait (the gateway's
  ``X-Modelyard-Cold-Start``) less the time loads ran during it (its model's, and those queued before it) is
  what the machinery added (the gateway's wake-up, the loader's poll and reports); less the evictions too, it is
  what remains once everything the loader did meanwhile is taken out.
- Meanwhile a co-tenant probe sends ``--probe-rate`` requests/s to the pinned model, and its p99 is compared
  with the same probe's p99 before the trace, when nothing loads.
- Warm overhead: in rounds before the trace, a resident on-demand model and the same model registered
  always-resident (a second name) are asked in turn through the same gateway.
- Memory: every second, the resident set size of Triton's process group (tritonserver and its python
  stubs) above its size with nothing loaded, tritonserver's own growth, and what the loader accounts against the
  budget. The loader's CPU: the user and system time of its threads over the trace.

Targets (issue 47): 0 failed requests; a hit rate at most 2 points below LRU simulated offline (Belady's optimum
reported beside it); at least 150 cold starts; the wait beyond the loads ≤ 50 ms p99; warm overhead ≤ 0.05 ms
p50; resident memory never above the budget; the pinned model's p99 during the trace ≤ 1.5 × its p99 with no
loads.

Usage::

    python bench/on_demand.py --duration 600
    python bench/on_demand.py --models 1000 --model-mib 4 --budget-share 0.05 \
        --json bench/results/on_demand_1000.json --markdown bench/results/on_demand_1000.md
"""

import argparse
import logging
import math
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests
from stack import REPO, _triton_install, finish, log, machine, percentile

from modelyard_agent.eviction import DemandPolicy, simulate_hits

NAME = "on_demand"
WIDTH = 64
PINNED, ALWAYS = "od_pinned", "od_always"
BODY = {"inputs": [{"name": "x", "shape": [1, WIDTH], "datatype": "FP32", "data": [0.5] * WIDTH}]}


def write_model(repository: Path, name: str, *, mib: int, execution_env: Path) -> None:
    """A python-backend model holding a ``mib`` MiB FP32 matrix (``static_batch_model.py``), version 1."""
    hidden = max(1, mib * (1 << 20) // (WIDTH * 4))
    version = repository / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "bench" / "static_batch_model.py", version / "model.py")
    (repository / name / "config.pbtxt").write_text(f"""name: "{name}"
backend: "python"
max_batch_size: 1
version_policy {{ specific {{ versions: 1 }} }}
input [{{ name: "x" data_type: TYPE_FP32 dims: [{WIDTH}] }}]
output [{{ name: "label" data_type: TYPE_INT64 dims: [1] }}]
instance_group [{{ kind: KIND_CPU count: 1 }}]
parameters {{ key: "HIDDEN_UNITS" value: {{ string_value: "{hidden}" }} }}
parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{execution_env}" }} }}
""")


def zipf_trace(models: list[str], length: int, s: float, seed: int) -> list[str]:
    """``length`` draws from Zipf(s) over ``models`` (rank 1 the most frequent), ranks shuffled by ``seed``."""
    rng = random.Random(seed)
    ranked = models[:]
    rng.shuffle(ranked)
    weights = [1.0 / (rank ** s) for rank in range(1, len(ranked) + 1)]
    return rng.choices(ranked, weights=weights, k=length)


def lru_hits(trace: list[str], capacity: int) -> int:
    """Hits of an LRU cache of ``capacity`` equal-sized models on ``trace``."""
    cache: OrderedDict[str, None] = OrderedDict()
    hits = 0
    for model in trace:
        if model in cache:
            hits += 1
            cache.move_to_end(model)
            continue
        cache[model] = None
        if len(cache) > capacity:
            cache.popitem(last=False)
    return hits


def belady_hits(trace: list[str], capacity: int) -> int:
    """Hits of Belady's optimum (evict the model asked for again farthest in the future) on ``trace``."""
    following, seen = [0] * len(trace), {}
    for i in range(len(trace) - 1, -1, -1):
        following[i] = seen.get(trace[i], math.inf)
        seen[trace[i]] = i
    cache: dict[str, float] = {}
    hits = 0
    for i, model in enumerate(trace):
        if model in cache:
            hits += 1
        elif len(cache) >= capacity:
            del cache[max(cache, key=cache.get)]
        cache[model] = following[i]
    return hits


def process_group_rss(pid: int) -> int:
    """Bytes resident in ``pid`` and its descendants (tritonserver and its python stubs)."""
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


def own_rss(pid: int) -> int:
    """Bytes resident in ``pid`` alone (tritonserver without its stubs)."""
    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


class LoadRecords(logging.Handler):
    """The loader's record of each load and eviction (``modelyard_agent.loads``): ``records``, each ``(action,
    model, outcome, started, ended, seconds)``, times in Unix seconds."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[tuple] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.args)


def covered(intervals: list[tuple[float, float]], low: float, high: float) -> float:
    """Seconds of ``[low, high]`` inside any of ``intervals`` (``(start, end)`` pairs, which never overlap: one
    loading thread)."""
    return sum(max(0.0, min(end, high) - max(start, low)) for start, end in intervals)


def loader_cpu(loader) -> float:
    """CPU seconds (user and system) the loader's threads (its poller and loading threads) used so far."""
    ids = {thread.native_id for thread in loader._threads}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


def infer(session: requests.Session, url: str, model: str) -> tuple[int, float, float | None, str]:
    """(status, seconds, seconds held for a cold start or None, the error of a failed answer) of one request
    through the gateway."""
    started = time.perf_counter()
    answer = session.post(f"{url}/v2/models/{model}/infer", json=BODY, timeout=120)
    seconds = time.perf_counter() - started
    cold = answer.headers.get("X-Modelyard-Cold-Start")
    return answer.status_code, seconds, float(cold) if cold else None, "" if answer.ok else answer.text[:300]


def counters(url: str) -> dict[str, float]:
    """The gateway's on-demand request counters by outcome, summed over the models of the trace (not the pinned
    one the probe asks)."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(requests.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == "modelyard_on_demand_requests_total" and sample.labels["model"] != PINNED:
                totals[sample.labels["outcome"]] = totals.get(sample.labels["outcome"], 0) + sample.value
    return totals


def probe(url: str, model: str, rate: float, stop: threading.Event, out: list[float]) -> None:
    """Send ``rate`` requests/s to ``model`` until ``stop``; latencies (seconds) of the 200s into ``out``."""
    with requests.Session() as session:
        next_at = time.perf_counter()
        while not stop.is_set():
            status, seconds, _, _ = infer(session, url, model)
            if status == 200:
                out.append(seconds)
            next_at += 1.0 / rate
            time.sleep(max(0.0, next_at - time.perf_counter()))


@dataclass
class BenchHost:
    """A tritonserver (explicit model control, as the tests start it) with its models in ``work``'s repository,
    and the host's gateway in front of it (``url``), as ``start_host`` started them."""

    work: Path
    triton: object
    gateway: object

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.listen_port}"

    def close(self) -> None:
        """Stop the gateway and Triton and remove ``work``."""
        self.gateway.stop()
        self.triton.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def start_host(models: list[str], *, mib: int, prefix: str) -> BenchHost:
    """``models`` written (``write_model``, ``mib`` MiB of weights each) into a new temporary directory named
    ``prefix``..., a tritonserver over them and the host's gateway, started (``BenchHost.close`` ends them)."""
    from modelyard_agent.runtimes.gateway import TritonGateway
    from tests.fixtures.services import free_port
    from tests.fixtures.triton import _start

    install = _triton_install()
    work = Path(tempfile.mkdtemp(prefix=prefix))
    work.chmod(0o711)
    for name in models:
        write_model(work / "models", name, mib=mib, execution_env=install.execution_env)
    (work / "triton").mkdir()
    triton = _start(install, work / "triton", work / "models")
    host = BenchHost(work, triton, TritonGateway(work / "gateway", free_port(),
                                                 triton=triton.http_url.removeprefix("http://"),
                                                 listen_host="127.0.0.1"))
    try:
        host.gateway.ensure_running()
    except BaseException:
        host.close()
        raise
    return host


def run(args: argparse.Namespace) -> dict:
    from modelyard_agent.residency import OnDemandLoader
    from modelyard_agent.runtimes.triton import TritonRuntime

    names = [f"od_{i:04d}" for i in range(args.models)]
    host = start_host([*names, PINNED, ALWAYS], mib=args.model_mib, prefix="modelyard-bench-on-demand-")
    work, triton, gateway, url = host.work, host.triton, host.gateway, host.url
    loader = None
    try:
        runtime = TritonRuntime(triton.http_url, load_timeout=300, grpc_url=triton.grpc_url)
        baseline_rss = process_group_rss(triton.process.pid)
        baseline_server_rss = own_rss(triton.process.pid)

        # Bare loads from local disk, and the footprint: the rise of the process group's resident set across a
        # load and its first inference (the stub's interpreter and numpy beside the weights), as the loader
        # measures it.
        load_seconds, rises, unload_seconds = [], [], []
        for name in names[:args.load_samples]:
            before_rss = process_group_rss(triton.process.pid)
            started = time.perf_counter()
            runtime.load(name, None)
            load_seconds.append(time.perf_counter() - started)
            # One inference first: a model's first one takes memory of its own, which the loader counts too.
            assert requests.post(f"{triton.http_url}/v2/models/{name}/infer", json=BODY, timeout=60).ok
            rises.append(process_group_rss(triton.process.pid) - before_rss)
            unload_started = time.perf_counter()
            runtime.unload(name)
            runtime.wait_versions_gone(name, [1], timeout=120)
            unload_seconds.append(time.perf_counter() - unload_started)
        bare_load, measured = statistics.mean(load_seconds), max(rises)
        log(NAME, f"bare load from local disk: mean {bare_load:.3f} s, unload {statistics.mean(unload_seconds):.3f} s,"
                  f" over {len(load_seconds)}; footprint {measured} bytes")
        capacity = max(1, math.floor(args.budget_share * args.models))
        budget = (capacity + 1) * measured  # the pinned model's share beside the others
        # Every model registered on demand with no footprint declared (the loader measures each at its first
        # load), and routed, so that its requests are counted in flight as a deployment's are.
        for name in [*names, PINNED]:
            gateway.register_on_demand(name, pinned=name == PINNED, cold_start_timeout=120, max_held=1000)
            gateway.set_route(name, stable=1)
        loader = OnDemandLoader(gateway, runtime, budget_bytes=budget, metrics_url=triton.metrics_url,
                                state_dir=work)
        records = LoadRecords()
        logging.getLogger("modelyard_agent.loads").addHandler(records)
        logging.getLogger("modelyard_agent.loads").setLevel(logging.INFO)
        loader.start()
        log(NAME, f"footprint {measured} bytes; budget {budget} bytes = {capacity} models + the pinned one")

        # Warm overhead: a resident on-demand model against the same model always resident, in turns.
        runtime.load(ALWAYS, None)
        with requests.Session() as session:
            assert infer(session, url, PINNED)[0] == 200
            warm = {"on_demand": [], "always": []}
            for _ in range(100):  # both warmed up first
                infer(session, url, PINNED), infer(session, url, ALWAYS)
            for _ in range(args.warm_rounds * 50):
                for label, model in (("on_demand", PINNED), ("always", ALWAYS)):
                    warm[label].append(infer(session, url, model)[1])
        runtime.unload(ALWAYS)

        # The pinned model with no loads going on.
        quiet: list[float] = []
        stop = threading.Event()
        thread = threading.Thread(target=probe, args=(url, PINNED, args.probe_rate, stop, quiet), daemon=True)
        thread.start()
        time.sleep(args.quiet_seconds)
        stop.set()
        thread.join()

        # The trace, its rate from LRU's offline miss ratio and the bare load time.
        sample = zipf_trace(names, 20000, args.zipf, args.seed)
        miss_ratio = 1 - lru_hits(sample, capacity) / len(sample)
        cycle = bare_load + statistics.mean(unload_seconds)  # a cold load in a full budget evicts one model too
        rate = args.load_share / (cycle * miss_ratio)
        length = max(1, int(rate * args.duration))
        trace = zipf_trace(names, length, args.zipf, args.seed)
        log(NAME, f"LRU miss ratio {miss_ratio:.3f}: {rate:.3f} requests/s for {args.duration} s ({length} requests)")

        before = counters(url)
        samples, peak = [], {"rss": 0, "accounted": 0}
        sampling = threading.Event()

        def sample_memory():
            while not sampling.wait(1.0):
                rss = max(0, process_group_rss(triton.process.pid) - baseline_rss)
                server = own_rss(triton.process.pid) - baseline_server_rss
                accounted = gateway.residency()["budget"].get("resident_bytes", 0)
                samples.append((rss, accounted, server))
                peak["rss"], peak["accounted"] = max(peak["rss"], rss), max(peak["accounted"], accounted)

        sampler = threading.Thread(target=sample_memory, daemon=True)
        sampler.start()
        during: list[float] = []
        stop = threading.Event()
        thread = threading.Thread(target=probe, args=(url, PINNED, args.probe_rate, stop, during), daemon=True)
        thread.start()
        results = []
        cpu_before, wall_before = loader_cpu(loader), time.time()
        started = time.perf_counter()
        local = threading.local()

        def send(model):
            local.session = getattr(local, "session", None) or requests.Session()
            sent = time.time()
            try:
                return (model, *infer(local.session, url, model), sent)
            except requests.RequestException as exc:
                return model, 0, 0.0, None, str(exc)[:300], sent

        with ThreadPoolExecutor(64) as pool:
            futures = []
            for i, model in enumerate(trace):
                time.sleep(max(0.0, started + i / rate - time.perf_counter()))
                futures.append(pool.submit(send, model))
            results = [f.result() for f in futures]
        stop.set()
        thread.join()
        sampling.set()
        sampler.join()
        after = counters(url)
        cpu_after, wall_after = loader_cpu(loader), time.time()
        measured_footprints = [peak_bytes for peak_bytes in (max(f.values()) for f in (
            loader.footprint(name) for name in names) if f)]
    finally:
        if loader is not None:
            loader.stop()
        logging.getLogger("modelyard_agent.loads").handlers.clear()
        host.close()

    failed = [r for r in results if r[1] != 200]
    hits = after.get("hit", 0) - before.get("hit", 0)
    colds = after.get("cold", 0) - before.get("cold", 0)
    held = [r[3] for r in results if r[1] == 200 and r[3] is not None]
    # Each cold wait less what the loader did meanwhile (its own records, modelyard_agent.loads): the loads alone
    # (the target), and the loads and evictions together. The hold is taken as [sent, sent + held]; it starts
    # about a millisecond after the request is sent.
    loads = [(r[3], r[4]) for r in records.records if r[0] == "load"]
    busy = [(r[3], r[4]) for r in records.records]
    cold = [(r[5], r[3]) for r in results if r[1] == 200 and r[3] is not None]
    beyond_loads = [held_s - covered(loads, sent, sent + held_s) for sent, held_s in cold]
    beyond_busy = [held_s - covered(busy, sent, sent + held_s) for sent, held_s in cold]
    load_durations = [e - s for s, e in loads]
    eviction_durations = [r[4] - r[3] for r in records.records if r[0] == "eviction"]
    excess = [rss - accounted for rss, accounted, _ in samples]
    over = [rss - budget for rss, _, _ in samples if rss > budget]
    hit_rate = hits / (hits + colds) if hits + colds else None
    lru = lru_hits(trace, capacity) / len(trace)
    belady = belady_hits(trace, capacity) / len(trace)
    # The loader's own eviction policy (modelyard_agent.eviction), the same code, on the same trace at its times.
    policy = simulate_hits(DemandPolicy(), trace, capacity, [i / rate for i in range(len(trace))]) / len(trace)
    cold_p99 = percentile(held, 99)
    warm_delta = (statistics.median(warm["on_demand"]) - statistics.median(warm["always"])) * 1000
    quiet_p99, during_p99 = percentile(quiet, 99), percentile(during, 99)
    checks = {
        "no failed request": not failed,
        "hit rate within 2 points of LRU": hit_rate is not None and hit_rate >= lru - 0.02,
        "≥ 150 cold starts": len(held) >= 150,
        "wait beyond the loads ≤ 50 ms p99": bool(beyond_loads) and percentile(beyond_loads, 99) <= 0.05,
        "warm overhead ≤ 0.05 ms p50": warm_delta <= 0.05,
        "memory within the budget": peak["accounted"] <= budget and peak["rss"] <= budget,
        "pinned p99 ≤ 1.5 × quiet": bool(quiet_p99 and during_p99 and during_p99 <= 1.5 * quiet_p99),
    }
    missed = [name for name, ok in checks.items() if not ok]
    return {
        "benchmark": NAME, "machine": machine(), "models": args.models, "model_mib": args.model_mib,
        "budget_bytes": budget, "capacity_models": capacity, "footprint_bytes": measured,
        "bare_load_seconds": bare_load, "bare_unload_seconds": statistics.mean(unload_seconds),
        "load_capacity_per_s": 1 / (bare_load + statistics.mean(unload_seconds)), "lru_miss_ratio_sample": miss_ratio,
        "rate_per_s": rate, "cold_loads_per_s": colds / args.duration, "duration_s": args.duration,
        "requests": len(results), "failed": len(failed), "failures": [r[1:] for r in failed[:10]],
        "hit_rate": hit_rate, "lru_hit_rate": lru, "belady_hit_rate": belady,
        "policy_hit_rate": policy, "cold_starts": len(held),
        "cold_p50_s": percentile(held, 50), "cold_p99_s": cold_p99,
        "warm_p50_ms": {k: statistics.median(v) * 1000 for k, v in warm.items()}, "warm_delta_p50_ms": warm_delta,
        "pinned_p99_quiet_ms": quiet_p99 and quiet_p99 * 1000, "pinned_p99_during_ms": during_p99 and during_p99 * 1000,
        "peak_rss_bytes": peak["rss"], "peak_accounted_bytes": peak["accounted"], "memory_samples": len(samples),
        "samples_over_budget": len(over), "most_over_budget_bytes": max(over, default=0),
        "peak_server_rss_growth_bytes": max((server for _, _, server in samples), default=0),
        "rss_minus_accounted_bytes": {"p50": percentile(excess, 50), "max": max(excess, default=None)},
        "load_share": args.load_share, "loads": len(loads), "evictions": len(eviction_durations),
        "load_seconds": {"p50": percentile(load_durations, 50), "p99": percentile(load_durations, 99)},
        "eviction_seconds": {"p50": percentile(eviction_durations, 50), "p99": percentile(eviction_durations, 99)},
        "beyond_loads_s": {"p50": percentile(beyond_loads, 50), "p99": percentile(beyond_loads, 99),
                           "max": max(beyond_loads, default=None)},
        "beyond_loads_and_evictions_s": {"p50": percentile(beyond_busy, 50), "p99": percentile(beyond_busy, 99),
                                         "max": max(beyond_busy, default=None)},
        "loader_cpu_s": cpu_after - cpu_before,
        "loader_cpu_share": (cpu_after - cpu_before) / (wall_after - wall_before),
        "footprints_measured": measured_footprints,
        "checks": checks, "verdict": "PASS" if not missed else "MISS",
        "verdict_reason": "every target met" if not missed else "missed: " + ", ".join(missed),
    }


def markdown(r: dict) -> str:
    def ms(value):
        return "n/a" if value is None else f"{value * 1000:.1f} ms"

    rows = "\n".join(f"| {name} | {'yes' if ok else '**no**'} |" for name, ok in r["checks"].items())
    failures = ("; first: " + " · ".join(f"{f[0]} {f[3]}".replace("|", "/") for f in r["failures"][:3])
                if r["failures"] else "")
    beyond, busy = r["beyond_loads_s"], r["beyond_loads_and_evictions_s"]
    footprints = r["footprints_measured"]
    return f"""# Models on demand{r.get('title_suffix', '')}

**Verdict: {r['verdict']}** — {r['verdict_reason']}

Machine: {r['machine']}. `{r['command']}`; the method is in the module's docstring.{r.get('note', '')}

- {r['models']} models registered on demand (python backend, {r['model_mib']} MiB of weights each), one more
  pinned, every one with a route; budget {r['budget_bytes']} bytes = {r['capacity_models']} models + the pinned
  one, at the footprint the benchmark measured across its own bare loads and a first inference each
  ({r['footprint_bytes']} bytes). The
  loader measured each model's footprint itself at its first load (none declared): {len(footprints)} measured,
  {min(footprints, default=0)} to {max(footprints, default=0)} bytes.
- Bare load from local disk: {r['bare_load_seconds']:.3f} s mean (an unload and its wait
  {r['bare_unload_seconds']:.3f} s), so a capacity of {r['load_capacity_per_s']:.3f} loads/s; trace rate
  {r['rate_per_s']:.3f} requests/s for {r['duration_s']:.0f} s ({r['requests']} requests), cold loads
  {r['cold_loads_per_s']:.3f}/s (aimed at {r['load_share']:.2f} of the capacity).
- The loader's own records (`modelyard_agent.loads`): {r['loads']} loads, p50 {ms(r['load_seconds']['p50'])},
  p99 {ms(r['load_seconds']['p99'])}; {r['evictions']} evictions, p50 {ms(r['eviction_seconds']['p50'])}, p99
  {ms(r['eviction_seconds']['p99'])}.

| measure | value |
|---|---|
| failed requests | {r['failed']} of {r['requests']}{failures} |
| hit rate (gateway's counters) | {r['hit_rate']:.3f} |
| LRU simulated offline, same trace and budget | {r['lru_hit_rate']:.3f} |
| Belady's optimum, same trace and budget | {r['belady_hit_rate']:.3f} |
| the loader's policy (`modelyard_agent.eviction`) simulated offline, same trace and budget | \
{r['policy_hit_rate']:.3f} |
| cold starts (held requests) | {r['cold_starts']}: wait p50 {ms(r['cold_p50_s'])}, p99 {ms(r['cold_p99_s'])} |
| wait beyond the loads (cold wait less the loads that ran during it: its own and those queued before it) | \
p50 {ms(beyond['p50'])}, p99 {ms(beyond['p99'])}, max {ms(beyond['max'])} (target p99 ≤ 50 ms) |
| wait beyond the loads and the evictions (less everything the loader did meanwhile) | \
p50 {ms(busy['p50'])}, p99 {ms(busy['p99'])}, max {ms(busy['max'])} |
| warm p50, on demand vs always | {r['warm_p50_ms']['on_demand']:.3f} vs {r['warm_p50_ms']['always']:.3f} ms \
(+{r['warm_delta_p50_ms']:.3f} ms) |
| pinned model p99, quiet vs during the trace | {r['pinned_p99_quiet_ms']:.2f} vs {r['pinned_p99_during_ms']:.2f} ms |
| memory sampled each second: peak RSS of Triton's processes above idle | {r['peak_rss_bytes']} bytes \
({r['memory_samples']} samples, {r['samples_over_budget']} above the budget, by {r['most_over_budget_bytes']} \
bytes at most) |
| peak memory, accounted by footprints | {r['peak_accounted_bytes']} bytes |
| RSS less what was accounted, same sample | p50 {r['rss_minus_accounted_bytes']['p50']}, \
max {r['rss_minus_accounted_bytes']['max']} bytes |
| tritonserver's own RSS growth (without its stubs), peak | {r['peak_server_rss_growth_bytes']} bytes |
| the loader's CPU (its poller and loading threads) over the trace | {r['loader_cpu_s']:.1f} s, \
{100 * r['loader_cpu_share']:.1f} % of one core |

| target | met |
|---|---|
{rows}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=REPO / f"bench/results/{NAME}.json")
    parser.add_argument("--markdown", type=Path, default=REPO / f"bench/results/{NAME}.md")
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--model-mib", type=int, default=32)
    parser.add_argument("--budget-share", type=float, default=0.15)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of trace (default 600)")
    parser.add_argument("--load-samples", type=int, default=5)
    parser.add_argument("--load-share", type=float, default=0.75,
                        help="the share of the host's load capacity the trace's cold loads should use (0.75)")
    parser.add_argument("--warm-rounds", type=int, default=20)
    parser.add_argument("--probe-rate", type=float, default=20.0)
    parser.add_argument("--quiet-seconds", type=float, default=30.0)
    parser.add_argument("--note", default="", help="a line for the results (what else ran on the machine)")
    args = parser.parse_args(argv)
    result = run(args)
    result["command"] = "python bench/on_demand.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.note:
        result["note"] = f"\n\n{args.note}"
    if args.models != 100:
        result["title_suffix"] = f", {args.models:,} models"
    return finish(NAME, args, result, markdown(result))


if __name__ == "__main__":
    raise SystemExit(main())
