"""Benchmark: models on demand at scale on one Triton host: what a warm request pays with 1,000 models
registered on demand, what registering them one at a time costs, and what the idle loader costs.

What it runs, all real: one tritonserver (explicit model control, as the tests start it) with two copies of the
benchmark's python-backend model (``bench/static_batch_model.py``, ``--model-mib`` of weights), the host's
gateway (nginx with its Lua modules) in front of it, and the agent's on-demand loader
(``modelyard_agent.residency.OnDemandLoader``, its threads in this process, as ``modelyard-agent`` runs them).

- ``--registered`` (1,000) models are registered on demand one at a time, as deployments register them
  (``register_on_demand``: one ``PATCH /residency`` each), timed; they are never asked for.
- ``od_warm`` is registered on demand too and resident; ``od_always`` is the same model, not registered. Both
  have the same route (stable version 1), so their requests take the same way through the gateway but for the
  on-demand check.
- Warm requests: ``--rounds`` rounds, each of ``--requests`` requests alternating between the two models on one
  kept-alive connection; each round's p50 of ``od_warm`` less its p50 of ``od_always`` is the added time, and
  the median over rounds is judged (the median of the paired differences of neighbouring requests beside it).
  Both sides run in the same rounds, so a busy machine slows both.
- CPU: the loader's threads (user + system, from ``/proc`` through psutil) and nginx's workers across the warm
  rounds, as a share of one core; the loader is idle then (its long poll waits for wants).

Targets: added p50 ≤ 0.05 ms; registering a model among 1,000 ≤ 20 ms p50; the idle loader ≤ 1 % of one core.

Usage::

    python bench/on_demand_scale.py --json bench/results/on_demand_scale.json \\
        --markdown bench/results/on_demand_scale.md
"""

import argparse
import statistics
import time
from pathlib import Path

import psutil
import requests
from on_demand import BODY, start_host
from stack import REPO, _triton_install, finish, log, machine, percentile

NAME = "on_demand_scale"
WARM, ALWAYS = "od_warm", "od_always"


def cpu_seconds(threads: list[int], nginx_pid: int) -> tuple[float, float]:
    """User + system CPU seconds so far of this process's threads whose native ids are ``threads``, and of the
    nginx master ``nginx_pid``'s workers."""
    mine = sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in threads)
    workers = sum(sum(worker.cpu_times()[:2]) for worker in psutil.Process(nginx_pid).children())
    return mine, workers


def timed(session: requests.Session, url: str, model: str) -> float:
    """Seconds one request for ``model`` took through the gateway (it must succeed)."""
    started = time.perf_counter()
    answer = session.post(f"{url}/v2/models/{model}/infer", json=BODY, timeout=60)
    seconds = time.perf_counter() - started
    assert answer.status_code == 200, answer.text
    return seconds


def run(args: argparse.Namespace) -> dict:
    from modelyard_agent.residency import OnDemandLoader
    from modelyard_agent.runtimes.triton import TritonRuntime

    host = start_host([WARM, ALWAYS], mib=args.model_mib, prefix="modelyard-bench-on-demand-scale-")
    gateway, url = host.gateway, host.url
    loader = None
    try:
        runtime = TritonRuntime(host.triton.http_url, load_timeout=300, grpc_url=host.triton.grpc_url)
        registering = []
        for index in range(args.registered):
            started = time.perf_counter()
            gateway.register_on_demand(f"od_filler_{index:05d}", cold_start_timeout=30)
            registering.append(time.perf_counter() - started)
        log(NAME, f"{args.registered} models registered one at a time in {sum(registering):.2f} s")
        for model in (WARM, ALWAYS):
            runtime.load(model, None)
            gateway.set_route(model, stable=1)
        gateway.register_on_demand(WARM, cold_start_timeout=30, state="resident")
        loader = OnDemandLoader(gateway, runtime, budget_bytes=None, metrics_url=host.triton.metrics_url,
                                state_dir=host.work)
        assert loader.start(), "the gateway did not count the loader as alive"
        threads = [thread.native_id for thread in loader._threads]
        nginx_pid = int((gateway.dir / "nginx.pid").read_text())
        rounds = []
        with requests.Session() as session:
            for _ in range(200):  # both warmed up first
                timed(session, url, WARM), timed(session, url, ALWAYS)
            before, started = cpu_seconds(threads, nginx_pid), time.monotonic()
            for index in range(args.rounds):
                samples = {WARM: [], ALWAYS: []}
                order = (WARM, ALWAYS) if index % 2 == 0 else (ALWAYS, WARM)
                for _ in range(args.requests // 2):
                    for model in order:
                        samples[model].append(timed(session, url, model))
                rounds.append({**{model: statistics.median(values) * 1000 for model, values in samples.items()},
                               "paired": statistics.median(w - a for w, a in zip(samples[WARM], samples[ALWAYS],
                                                                                  strict=True)) * 1000})
            wall = time.monotonic() - started
            after = cpu_seconds(threads, nginx_pid)
        assert gateway.residency()["models"][WARM]["state"] == "resident"
    finally:
        if loader is not None:
            loader.stop()
        host.close()
    added = [r[WARM] - r[ALWAYS] for r in rounds]
    loader_share = 100 * (after[0] - before[0]) / wall
    nginx_share = 100 * (after[1] - before[1]) / wall
    register_p50 = statistics.median(registering) * 1000
    checks = {"added p50 ≤ 0.05 ms": statistics.median(added) <= 0.05,
              "registering one model among 1,000 ≤ 20 ms p50": register_p50 <= 20,
              "idle loader ≤ 1 % of one core": loader_share <= 1}
    failed = [name for name, ok in checks.items() if not ok]
    return {
        "name": NAME, "machine": machine(), "run": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "registered": args.registered, "rounds": rounds, "requests_per_round": args.requests,
        "added_p50_ms": {"median": statistics.median(added), "min": min(added), "max": max(added)},
        "added_paired_ms": statistics.median(r["paired"] for r in rounds),
        "ratio_p50": statistics.median(r[WARM] / r[ALWAYS] for r in rounds),
        "register_ms": {"p50": register_p50, "p99": percentile(registering, 99) * 1000,
                        "total_s": sum(registering)},
        "loader_cpu_percent": loader_share, "nginx_workers_cpu_percent": nginx_share, "wall_s": wall,
        "checks": checks, "verdict": "FAIL" if failed else "PASS",
        "verdict_reason": ("missed: " + ", ".join(failed)) if failed else "every target met",
    }


def markdown(r: dict) -> str:
    rows = "\n".join(f"| {i + 1} | {row[WARM]:.3f} | {row[ALWAYS]:.3f} | {row[WARM] - row[ALWAYS]:+.3f} |"
                     for i, row in enumerate(r["rounds"]))
    return f"""# Models on demand at scale

Run {r['run']} on {r['machine']}. **Verdict: {r['verdict']}** ({r['verdict_reason']}).

| measure | value |
|---|---|
| models registered on demand | {r['registered']} (+ `{WARM}`) |
| warm p50 added by the on-demand check, median over rounds | {r['added_p50_ms']['median']:+.3f} ms \
(rounds from {r['added_p50_ms']['min']:+.3f} to {r['added_p50_ms']['max']:+.3f}) |
| median of the requests' paired differences (each on-demand request less the next or previous plain one), \
median over rounds | {r['added_paired_ms']:+.3f} ms |
| warm p50 ratio, on demand / not registered, median over rounds | {r['ratio_p50']:.3f} |
| registering one model (one `PATCH /residency`) among up to {r['registered']} | p50 {r['register_ms']['p50']:.2f} ms, \
p99 {r['register_ms']['p99']:.2f} ms, {r['register_ms']['total_s']:.2f} s in all |
| the idle loader's threads | {r['loader_cpu_percent']:.2f} % of one core |
| nginx's workers (serving the rounds and the long poll) | {r['nginx_workers_cpu_percent']:.1f} % of one core |

Per round ({r['requests_per_round']} requests, alternating; p50 in ms):

| round | `{WARM}` (on demand, resident) | `{ALWAYS}` (not registered) | added |
|---:|---:|---:|---:|
{rows}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registered", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--requests", type=int, default=2000, help="requests per round, both models together")
    parser.add_argument("--model-mib", type=int, default=1)
    parser.add_argument("--json", type=Path, default=REPO / f"bench/results/{NAME}.json")
    parser.add_argument("--markdown", type=Path, default=REPO / f"bench/results/{NAME}.md")
    args = parser.parse_args(argv)
    _triton_install()
    result = run(args)
    return finish(NAME, args, result, markdown(result))


if __name__ == "__main__":
    raise SystemExit(main())
