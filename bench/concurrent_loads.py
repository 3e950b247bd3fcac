"""Benchmark: what concurrent on-demand loads (``--concurrent-loads``) buy when several cold models are wanted at once.

What it runs, all real, as ``bench/on_demand.py`` runs it: one tritonserver (explicit model control), the host's
gateway (nginx with its Lua modules) and the agent's on-demand loader (``modelyard_agent.residency``) in this
process, Triton reached over gRPC model control.

- ``--models`` (8) python-backend models (``bench/static_batch_model.py``), each holding an FP32 weight matrix
  of ``--model-mib`` (32 MiB) drawn when it loads, registered on demand with a declared footprint (so that no
  load has to run alone to be measured), no memory budget.
- For each setting of ``--settings`` (1, 2 and 4 loads at once): a loader with that setting; then, ``--rounds``
  times, every model is unloaded and one request for each is sent at once (a burst of cold models, as after a
  restart or a traffic shift). Measured per burst: the time until the last answer (the burst's makespan) and
  each request's wait; p50 over the rounds.

The speed-up is the makespan with 1 over the makespan with N. Loads compete for the CPU (each python-backend
load starts an interpreter and draws its weights), the disk and Triton's own load threads, so it is below N; on
this 2-core machine, more than 2 gain little. Nothing here asserts it.

Usage::

    python bench/concurrent_loads.py            # bench/results/concurrent_loads.md
"""

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from on_demand import BODY, start_host
from stack import REPO, finish, log, machine

NAME = "concurrent_loads"


def burst(url: str, models: list[str]) -> tuple[float, list[float], list[int]]:
    """One request for each of ``models`` at once: (seconds until the last answer, each request's seconds, each
    status)."""
    started = time.perf_counter()

    def ask(model: str) -> tuple[float, int]:
        answer = requests.post(f"{url}/v2/models/{model}/infer", json=BODY, timeout=300)
        return time.perf_counter() - started, answer.status_code

    with ThreadPoolExecutor(len(models)) as pool:
        answers = list(pool.map(ask, models))
    return max(seconds for seconds, _ in answers), [s for s, _ in answers], [code for _, code in answers]


def run(args: argparse.Namespace) -> dict:
    from modelyard_agent.residency import OnDemandLoader
    from modelyard_agent.runtimes.triton import TritonRuntime

    names = [f"cl_{i:02d}" for i in range(args.models)]
    host = start_host(names, mib=args.model_mib, prefix="modelyard-bench-concurrent-loads-")
    work, triton, gateway, url = host.work, host.triton, host.gateway, host.url
    results: dict[str, dict] = {}
    try:
        runtime = TritonRuntime(triton.http_url, load_timeout=300, grpc_url=triton.grpc_url)
        for name in names:
            gateway.register_on_demand(name, cold_start_timeout=300, max_held=100,
                                       footprint_bytes=args.model_mib << 20)
        for setting in args.settings:
            loader = OnDemandLoader(gateway, runtime, budget_bytes=None, state_dir=work, concurrent_loads=setting)
            loader.start()
            makespans, waits, failed = [], [], 0
            try:
                for round_number in range(args.rounds + 1):  # the first round warms the page cache: not counted
                    for name in names:
                        runtime.unload(name)
                    for name in names:
                        runtime.wait_versions_gone(name, [1], timeout=120)
                    loader.sync()  # the gateway reads them cold now
                    makespan, seconds, codes = burst(url, names)
                    failed += sum(code != 200 for code in codes)
                    if round_number:
                        makespans.append(makespan)
                        waits.extend(seconds)
            finally:
                loader.stop()
            results[str(setting)] = {"makespan_p50_s": statistics.median(makespans), "makespans_s": makespans,
                                     "wait_p50_s": statistics.median(waits), "failed": failed}
            log(NAME, f"{setting} at once: makespan p50 {results[str(setting)]['makespan_p50_s']:.3f} s, "
                      f"wait p50 {results[str(setting)]['wait_p50_s']:.3f} s, {failed} failed")
    finally:
        host.close()
    one = results[str(args.settings[0])]["makespan_p50_s"]
    for row in results.values():
        row["speedup"] = one / row["makespan_p50_s"]
    failed = sum(row["failed"] for row in results.values())
    speedups = ", ".join(f"{setting} at once {row['speedup']:.2f}×" for setting, row in results.items())
    return {"verdict": "MEASURED" if not failed else "FAIL",
            "verdict_reason": f"burst makespan speed-up over {args.settings[0]}: {speedups}; {failed} failed",
            "name": NAME, "machine": machine(), "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "models": args.models, "model_mib": args.model_mib, "rounds": args.rounds, "settings": results}


def markdown(r: dict) -> str:
    rows = "\n".join(f"| {setting} | {row['makespan_p50_s']:.3f} | {row['wait_p50_s']:.3f} | {row['speedup']:.2f}× "
                     f"| {row['failed']} |" for setting, row in r["settings"].items())
    return f"""# Concurrent on-demand loads: a burst of cold models

**Verdict: {r['verdict']}** — {r['verdict_reason']}

Run {r['when']} on {r['machine']}. `python bench/concurrent_loads.py` (`bench/concurrent_loads.py` says what it
runs): {r['models']} python-backend models of {r['model_mib']} MiB of weights, all cold, one request for each
sent at once; {r['rounds']} rounds per setting after one warm-up round; real Triton, gateway and loader.

| loads at once (`--concurrent-loads`) | makespan p50 s | request wait p50 s | speed-up over 1 | failed |
|---|---|---|---|---|
{rows}

The makespan is the time until the last model of the burst answers. Loads share this machine's 2 cores (each
python-backend load starts an interpreter and draws its weights) and Triton's load threads, so the speed-up
stays below the number of loads at once.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=REPO / f"bench/results/{NAME}.json")
    parser.add_argument("--markdown", type=Path, default=REPO / f"bench/results/{NAME}.md")
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--model-mib", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--settings", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args(argv)
    result = run(args)
    return finish(NAME, args, result, markdown(result))


if __name__ == "__main__":
    raise SystemExit(main())
