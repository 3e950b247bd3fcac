"""Benchmark: planning a rollout of 1,000 model versions over 100 simulated GPU hosts.

Planning is ``deployments.placement.plan_fleet``: every model version, largest footprint first,
goes to the hosts with the most free GPU memory that can hold it, and each placement is charged
against its hosts before the next one is planned; each model's hosts are split into batches.
The hosts are simulated (a seeded random fleet of 141 GiB H200-sized GPUs, 0-40 % already used);
footprints are 0.25-4 GiB, replicas 1-3, batch size 2. No database and no network: planning is
pure computation once hosts and footprints are read (one query each in the service).

Baseline of the same run: the same plan made the obvious way, with a full sort of the fleet per
model version (``deployments.placement.plan`` per demand). Each is timed ``--repeats`` times; the
verdict is the median of ``plan_fleet`` under ``--target-s`` seconds.

Usage::

    python bench/rollout_planning.py --json bench/results/rollout_planning.json \\
        --markdown bench/results/rollout_planning.md
"""

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")

GIB = 1 << 30
GPU_BYTES = 141 * GIB


def fleet(models: int, hosts: int, seed: int):
    """Return (demands, candidates) of a seeded random fleet."""
    from deployments.placement import HostCapacity

    rng = random.Random(seed)
    candidates = [HostCapacity(f"gpu-{i:03d}", int(GPU_BYTES * (1 - rng.uniform(0.0, 0.4)))) for i in range(hosts)]
    demands = [(f"model-{i:04d}", int(rng.uniform(0.25, 4) * GIB), rng.randint(1, 3)) for i in range(models)]
    demands.sort(key=lambda d: -d[1])
    return demands, candidates


def baseline(demands, candidates, batch_size: int):
    """The same plan with a full sort of the fleet for every demand."""
    from deployments.placement import HostCapacity, Placement, plan

    free = {c.name: c.free_gpu_bytes for c in candidates}
    out = []
    for model, need, replicas in demands:
        chosen = plan([HostCapacity(n, f) for n, f in free.items()], footprint_bytes=need, replicas=replicas)
        for name in chosen:
            free[name] -= need
        out.append(Placement(model, tuple(chosen), tuple(i // batch_size for i in range(len(chosen)))))
    return out


def timed(fn, repeats: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return times, result


def run(models: int, hosts: int, repeats: int, target_s: float, seed: int) -> dict:
    import django

    django.setup()
    from deployments.placement import plan_fleet

    demands, candidates = fleet(models, hosts, seed)
    ours_times, ours = timed(lambda: plan_fleet(demands, candidates, batch_size=2), repeats)
    base_times, base = timed(lambda: baseline(demands, candidates, 2), repeats)
    same = [p.hosts for p in ours] == [p.hosts for p in base]
    placed = sum(len(p.hosts) for p in ours)
    median = statistics.median(ours_times)
    verdict = "pass" if median < target_s and same else "fail"
    return {
        "benchmark": "rollout_planning",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "fleet": {"models": models, "hosts": hosts, "replicas_placed": placed, "batch_size": 2, "seed": seed},
        "plan_fleet_s": {"median": median, "min": min(ours_times), "max": max(ours_times), "runs": ours_times},
        "baseline_s": {"median": statistics.median(base_times), "runs": base_times},
        "ratio_baseline_over_ours": statistics.median(base_times) / median if median else None,
        "same_plan_as_baseline": same,
        "target_s": target_s,
        "verdict": verdict,
        "verdict_reason": (f"median {median * 1000:.1f} ms to plan {models} model versions ({placed} placements) "
                           f"over {hosts} hosts; target under {target_s:g} s"
                           + ("" if same else "; the plan differs from the baseline's")),
    }


def write_results(result: dict, json_path: Path, markdown_path: Path) -> None:
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    r = result
    lines = [
        "# Rollout planning: 1,000 model versions over 100 hosts", "",
        f"Run {r['when']} on Python {r['machine']['python']}, {r['machine']['cpus']} CPUs. "
        "Command: `bench/run.sh rollout_planning`.", "",
        "| what | median | min | max |", "| --- | --- | --- | --- |",
        f"| plan_fleet | {r['plan_fleet_s']['median'] * 1000:.1f} ms | {r['plan_fleet_s']['min'] * 1000:.1f} ms "
        f"| {r['plan_fleet_s']['max'] * 1000:.1f} ms |",
        f"| baseline (full sort per model) | {r['baseline_s']['median'] * 1000:.1f} ms | | |", "",
        f"Placements: {r['fleet']['replicas_placed']}; same plan as the baseline: {r['same_plan_as_baseline']}; "
        f"baseline / ours: {r['ratio_baseline_over_ours']:.2f}×.", "",
        f"**Verdict: {r['verdict'].upper()}** — {r['verdict_reason']}", "",
    ]
    markdown_path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--target-s", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--markdown", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run(args.models, args.hosts, args.repeats, args.target_s, args.seed)
    write_results(result, args.json, args.markdown)
    print(result["verdict_reason"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
