"""Benchmark: time from the deployment API call to the host READY, against download + Triton load.

What it runs, all real (see ``bench/stack.py``): PostgreSQL database ``modelyard_rbench_deploy``,
Redis as the Celery broker, the S3 stand-in, one tritonserver, a Celery orchestrator and the host's
agent. The API is called in process through DRF's ``APIClient`` (no gunicorn: an HTTP hop is not
what is measured here).

``--rounds + 1`` versions of the demo iris model (python backend running onnxruntime, with the
smoke-test sample input in its metadata) are registered. Round 0 deploys the first version onto an
empty host (a first load); each later round deploys the next, never-staged version, so every
round downloads, extracts, loads beside the serving version, runs the smoke inference and cuts over
(a swap).

Each round measures, in this order on the same host:

1. Raw baseline: (a) ``download_file`` of the same artifact from the same S3 endpoint and bucket
   (boto3, through the product's ``ArtifactStore`` client), then (b) Triton loading the same model
   version with the same config on a fresh model name (``TritonRuntime.load``, files extracted
   beforehand, untimed). Its unload (until Triton no longer lists it) is timed too, for reference:
   a swap also waits for the replaced version to go, which the raw sum leaves out.
2. The product: from ``POST /api/v1/deployments/`` until the host's target is READY (the database
   polled every 20 ms). Where the time went: the target's details (agent steps: stage, load,
   smoke, cut-over seconds), its dispatch time, and the agent worker's log (task received, task
   run time).

The verdict, each within 10 % of its baseline or 1 s, whichever is larger: a first deployment
(round 0) against the raw download + load; a swap (median over the later rounds) against the raw
download + load + unload, since a swap is READY only once the replaced version is gone from Triton
(the rollout's last step) and that unload is Triton's own time. The swap's overhead over download +
load alone is reported as well. Nothing here asserts it. ``--before`` names the JSON of an earlier run
(e.g. before a fix) whose medians the markdown shows beside this run's.

Usage::

    python bench/deploy_overhead.py --json bench/results/deploy_overhead.json \\
        --markdown bench/results/deploy_overhead.md
"""

import argparse
import json
import os
import re
import shutil
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from stack import MODEL, REPO, RolloutStack, add_common_arguments, finish, log, machine

NAME = "deploy_overhead"
HOST = "bench-host"
POLL_S = 0.02
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ")
BEFORE = REPO / f"bench/results/{NAME}-before.json"  # the run before the __pycache__ and poll fixes
AGENT_STEPS = ("stage_seconds", "load_seconds", "smoke_seconds", "cutover_seconds")


def raw_baseline(stack: RolloutStack, version: int, round_number: int) -> dict:
    """Download the version's artifact and load it under a fresh model name; seconds of each."""
    from modelyard_agent.formats.archives import extract_version_dir, inspect_triton_archive
    from modelyard_agent.formats.triton_config import render_load_config
    from modelyard_agent.runtimes.triton import TritonRuntime
    from registry.formats import archive_limits
    from registry.models import ModelVersion
    from registry.storage import ArtifactStore

    row = ModelVersion.objects.get(model__name=MODEL, version=version)
    triton = stack.hosts[HOST].triton
    store = ArtifactStore()
    scratch = stack.workdir / f"raw-{round_number}"
    scratch.mkdir()
    archive = scratch / "artifact"
    started = time.perf_counter()
    store.client.download_file(store.bucket, row.artifact_key, str(archive))
    download_s = time.perf_counter() - started

    name = f"raw-{round_number}"
    limits = archive_limits()
    layout = inspect_triton_archive(archive, limits)
    (triton.model_repository / name).mkdir()
    extract_version_dir(archive, layout, triton.model_repository / name / str(version), limits)
    (triton.model_repository / name / "config.pbtxt").write_text(row.config_text)
    config = render_load_config(row.config_text, model_name=name, versions=[version],
                                parameters={"EXECUTION_ENV_PATH": str(triton.execution_env)})
    runtime = TritonRuntime(triton.http_url, load_timeout=600)
    started = time.perf_counter()
    runtime.load(name, config)
    load_s = time.perf_counter() - started
    if not runtime.is_version_ready(name, version):
        raise RuntimeError(f"raw load of {name} version {version} is not READY")
    started = time.perf_counter()
    runtime.unload(name)
    runtime.wait_versions_gone(name, [version], timeout=120, poll=POLL_S)
    unload_s = time.perf_counter() - started
    shutil.rmtree(scratch)
    return {"download_s": download_s, "load_s": load_s, "sum_s": download_s + load_s, "unload_s": unload_s}


def _agent_task_times(log_text: str, since: float) -> dict:
    """When the agent received its deploy task after ``since`` (epoch s), and how long it ran (s)."""
    received, runtime = None, None
    pattern = re.compile(r"deployments\.deploy_version_on_host\[[^\]]+\] (received|succeeded in ([0-9.]+)s)")
    for line in log_text.splitlines():
        stamp, found = STAMP.match(line), pattern.search(line)
        if not (stamp and found):
            continue
        at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at < since - 0.002:
            continue
        if found.group(1) == "received" and received is None:
            received = at
        elif found.group(2) and received is not None and runtime is None:
            runtime = float(found.group(2))
    return {"received": received, "run_s": runtime}


def product_deploy(stack: RolloutStack, version: int) -> dict:
    """Deploy ``version`` to the host through the API; time to READY and where it went (seconds)."""
    from deployments.choices import TargetState
    from deployments.models import DeploymentTarget

    wall = time.time()
    started = time.perf_counter()
    deployment_id = stack.deploy(version, [HOST])
    api_s = time.perf_counter() - started
    target = DeploymentTarget.objects.get(deployment_id=deployment_id)
    while True:
        state = DeploymentTarget.objects.values_list("state", flat=True).get(pk=target.pk)
        if state in (TargetState.READY, TargetState.FAILED):
            break
        if time.perf_counter() - started > 300:
            raise RuntimeError(f"deployment {deployment_id} not ready after 300 s")
        time.sleep(POLL_S)
    ready_s = time.perf_counter() - started
    status = stack.wait_finished(deployment_id)
    finished_s = time.perf_counter() - started
    target.refresh_from_db()
    if state != TargetState.READY:
        raise RuntimeError(f"deployment {deployment_id} failed: {target.error}")
    events = {e.to_state: e.created_at.timestamp() - wall for e in target.events.all()}
    agent = _agent_task_times(stack.hosts[HOST].agent.log_text(), wall)
    details = target.details
    steps = {key: details.get(key, 0.0) for key in AGENT_STEPS}
    result = {
        "deployment": deployment_id, "status": status, "ready_s": ready_s, "finished_s": finished_s,
        "api_call_s": api_s, "dispatched_at_s": target.dispatched_at.timestamp() - wall,
        "agent_received_at_s": agent["received"] - wall if agent["received"] else None,
        "agent_task_s": agent["run_s"],
        "events_at_s": events, "agent_steps_s": steps, "agent_steps_total_s": sum(steps.values()),
        "previous_versions": details.get("previous_versions"),
    }
    result["outside_agent_steps_s"] = ready_s - result["agent_steps_total_s"]
    if result["agent_received_at_s"] is not None and agent["run_s"] is not None:
        result["report_back_s"] = ready_s - result["agent_received_at_s"] - agent["run_s"]
        result["agent_task_outside_steps_s"] = agent["run_s"] - result["agent_steps_total_s"]
    return result


def summarise(rounds: list[dict]) -> dict:
    """Medians (seconds) over swap rounds of each measure."""
    def median(get):
        values = [v for v in (get(r) for r in rounds) if v is not None]
        return round(statistics.median(values), 3) if values else None

    return {
        "raw_download_s": median(lambda r: r["raw"]["download_s"]),
        "raw_load_s": median(lambda r: r["raw"]["load_s"]),
        "raw_sum_s": median(lambda r: r["raw"]["sum_s"]),
        "raw_unload_s": median(lambda r: r["raw"].get("unload_s")),
        "product_ready_s": median(lambda r: r["product"]["ready_s"]),
        "overhead_s": median(lambda r: r["product"]["ready_s"] - r["raw"]["sum_s"]),
        "overhead_beyond_unload_s": median(
            lambda r: r["product"]["ready_s"] - r["raw"]["sum_s"] - r["raw"]["unload_s"] if "unload_s" in r["raw"]
            else None),
        "api_call_s": median(lambda r: r["product"]["api_call_s"]),
        "dispatched_at_s": median(lambda r: r["product"]["dispatched_at_s"]),
        "agent_received_at_s": median(lambda r: r["product"]["agent_received_at_s"]),
        "agent_task_s": median(lambda r: r["product"]["agent_task_s"]),
        "report_back_s": median(lambda r: r["product"].get("report_back_s")),
        "agent_task_outside_steps_s": median(lambda r: r["product"].get("agent_task_outside_steps_s")),
        **{f"agent_{k}": median(lambda r, k=k: r["product"]["agent_steps_s"][k]) for k in AGENT_STEPS},
        "outside_agent_steps_s": median(lambda r: r["product"]["outside_agent_steps_s"]),
    }


def run(args: argparse.Namespace) -> dict:
    """Start the stack, measure the rounds, and return the results (with the verdict) as a dict."""
    result: dict = {"benchmark": NAME, "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "machine": machine(), "rounds_requested": args.rounds}
    with RolloutStack(bench=NAME, database=args.database, broker_url=args.broker, hosts=(HOST,),
                      keep=args.keep) as stack:
        log(NAME, f"stack up in {stack.timings['start_s']} s; registering {args.rounds + 1} versions")
        versions = stack.upload_iris(args.rounds + 1)
        result["load_average_1m_before"] = round(os.getloadavg()[0], 2)
        rounds = []
        for number, version in enumerate(versions):
            raw = raw_baseline(stack, version, number)
            product = product_deploy(stack, version)
            rounds.append({"round": number, "version": version, "kind": "first load" if number == 0 else "swap",
                           "raw": raw, "product": product})
            log(NAME, f"round {number} (v{version}): raw {raw['sum_s']:.2f} s (download {raw['download_s']:.3f} + "
                      f"load {raw['load_s']:.2f}), product {product['ready_s']:.2f} s, steps "
                      f"{product['agent_steps_s']}")
        result["load_average_1m_after"] = round(os.getloadavg()[0], 2)
        result["stack"] = stack.timings
    result["rounds"] = rounds
    result["first_load"] = rounds[0]
    swaps = rounds[1:]
    result["swaps"] = summarise(swaps)
    s = result["swaps"]
    first = rounds[0]
    result["first_load_overhead_s"] = round(first["product"]["ready_s"] - first["raw"]["sum_s"], 3)
    first_allowed = max(args.target_fraction * first["raw"]["sum_s"], args.target_floor_s)
    swap_raw = s["raw_sum_s"] + s["raw_unload_s"]
    allowed = max(args.target_fraction * swap_raw, args.target_floor_s)
    result["target"] = {"fraction": args.target_fraction, "floor_s": args.target_floor_s,
                        "allowed_s": round(allowed, 3), "first_load_allowed_s": round(first_allowed, 3)}
    passed = s["overhead_beyond_unload_s"] <= allowed and result["first_load_overhead_s"] <= first_allowed
    result["verdict"] = "pass" if passed else "fail"
    result["verdict_reason"] = (
        f"first deployment {result['first_load_overhead_s']:.2f} s over its raw download + load "
        f"(target ≤ {first_allowed:.2f} s); a swap {s['overhead_beyond_unload_s']:.2f} s over the raw download + "
        f"load + unload of {swap_raw:.2f} s (median of {len(swaps)}; target ≤ {allowed:.2f} s, the larger of "
        f"{args.target_fraction:.0%} and {args.target_floor_s:g} s). Over download + load alone a swap takes "
        f"{s['overhead_s']:.2f} s more, {s['raw_unload_s']:.2f} s of it Triton unloading the replaced version"
    )
    result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    if args.before:
        before = json.loads(args.before.read_text())
        shown = args.before.relative_to(REPO) if args.before.is_relative_to(REPO) else args.before
        result["before"] = {"file": str(shown),
                            "finished_at": before["finished_at"], "swaps": before["swaps"],
                            "verdict_reason": before["verdict_reason"]}
    return result


def _f(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def markdown(r: dict) -> str:
    """The results as the markdown report (bench/results/deploy_overhead.md)."""
    s = r["swaps"]
    lines = [
        "# Deploy overhead: API call to READY vs download + Triton load", "",
        f"Run {r['finished_at']} on {r['machine']}. Command: `bench/run.sh {NAME}`.", "",
        f"**Verdict: {r['verdict'].upper()}** — {r['verdict_reason']}", "",
        "## Setup", "",
        "- Real components (bench/stack.py): PostgreSQL (dedicated database, migrated), Redis broker, moto_server "
        "S3, one tritonserver 2.51 (CPU, explicit model control), a Celery orchestrator (queue `default`, "
        "concurrency 2) and the host's agent (`modelyard-agent`, queue `host.<name>`, concurrency 1, no database "
        "or S3 settings), all as subprocesses.",
        "- The API is called in process (DRF `APIClient`, token auth, no gunicorn); the target's state is polled "
        f"in the database every {POLL_S * 1000:.0f} ms.",
        "- Model: the demo iris classifier (python backend + onnxruntime, archive of a few KB), with the smoke "
        "sample input in its metadata, so a swap is stage → load beside the old version → smoke inference → "
        "cut-over. Each round deploys a version never staged before.",
        "- Raw baseline of each round, just before the deploy: boto3 `download_file` of the same object from the "
        "same endpoint, plus `TritonRuntime.load` of the same version and config on a fresh model name.",
        f"- 1-minute load average {r['load_average_1m_before']} before, {r['load_average_1m_after']} after "
        "(the machine is shared).", "",
        "## Swaps (medians)", "",
        "| measure | seconds |", "|---|---|",
        f"| raw: download | {_f(s['raw_download_s'], 3)} |",
        f"| raw: Triton load | {_f(s['raw_load_s'])} |",
        f"| (raw: Triton unload, not in the sum) | {_f(s['raw_unload_s'])} |",
        f"| **raw sum** | **{_f(s['raw_sum_s'])}** |",
        f"| **product: API call → target READY** | **{_f(s['product_ready_s'])}** |",
        f"| **overhead** (median of per-round differences) | **{_f(s['overhead_s'])}** |",
        f"| overhead beyond download + load + unload | {_f(s['overhead_beyond_unload_s'])} |", "",
        "A swap cannot be READY before the replaced version is gone (the target's cut-over step waits for it, "
        "so that the next load on the host finds the memory back); the raw sum leaves that unload out, so it is "
        "shown beside it. First load (round 0, not in the medians): "
        f"product {_f(r['first_load']['product']['ready_s'])} s, raw {_f(r['first_load']['raw']['sum_s'])} s, "
        f"overhead {_f(r['first_load_overhead_s'])} s.", "",
        "Where the product's time went (medians; times are from the API call):", "",
        "| step | seconds |", "|---|---|",
        f"| API call returned | {_f(s['api_call_s'], 3)} |",
        f"| target dispatched (orchestrator ran advance_rollout) | at {_f(s['dispatched_at_s'], 3)} |",
        f"| agent received its task | at {_f(s['agent_received_at_s'], 3)} |",
        f"| agent task run time | {_f(s['agent_task_s'])} |",
        f"| — stage (download, check, extract) | {_f(s['agent_stage_seconds'], 3)} |",
        f"| — load beside the old version | {_f(s['agent_load_seconds'])} |",
        f"| — smoke inference | {_f(s['agent_smoke_seconds'], 3)} |",
        f"| — cut-over (load the new version alone, wait for the old to unload) | {_f(s['agent_cutover_seconds'])} |",
        f"| — rest of the agent task (lock, reports, readiness checks, memory reads) | "
        f"{_f(s['agent_task_outside_steps_s'], 3)} |",
        f"| READY report back to the database | {_f(s['report_back_s'], 3)} |",
        f"| everything but the agent's four steps | {_f(s['outside_agent_steps_s'])} |", "",
    ]
    if r.get("before"):
        b = r["before"]["swaps"]
        lines += [
            f"## Before and after (swap medians; before: `{r['before']['file']}`, run {r['before']['finished_at']})",
            "", "| measure | before | after |", "|---|---|---|",
            *(f"| {label} | {_f(b.get(key))} | {_f(s.get(key))} |" for label, key in (
                ("raw sum", "raw_sum_s"), ("product: API call → READY", "product_ready_s"),
                ("overhead", "overhead_s"), ("agent: load beside the old version", "agent_load_seconds"),
                ("agent: cut-over", "agent_cutover_seconds"),
                ("everything but the agent's four steps", "outside_agent_steps_s"))),
            "",
        ]
    lines += [
        "## Every round", "",
        "| round | kind | version | raw download | raw load | raw sum | product READY | stage | load | smoke | "
        "cut-over |", "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in r["rounds"]:
        steps = x["product"]["agent_steps_s"]
        lines.append(
            f"| {x['round']} | {x['kind']} | {x['version']} | {_f(x['raw']['download_s'], 3)} | "
            f"{_f(x['raw']['load_s'])} | {_f(x['raw']['sum_s'])} | {_f(x['product']['ready_s'])} | "
            f"{_f(steps['stage_seconds'], 3)} | "
            f"{_f(steps['load_seconds'])} | {_f(steps['smoke_seconds'], 3)} | {_f(steps['cutover_seconds'])} |")
    lines += ["", "All times in seconds. The first load (round 0) is not in the medians.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 whatever the verdict)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser, name=NAME, database="modelyard_rbench_deploy")
    parser.add_argument("--rounds", type=int, default=5, help="swaps measured (after one first load)")
    parser.add_argument("--target-fraction", type=float, default=0.10)
    parser.add_argument("--target-floor-s", type=float, default=1.0)
    parser.add_argument("--before", type=Path, default=BEFORE if BEFORE.exists() else None,
                        help=f"JSON results of an earlier run to compare with (default {BEFORE.relative_to(REPO)} "
                             "when present)")
    args = parser.parse_args(argv)
    result = run(args)
    return finish(NAME, args, result, markdown(result))


if __name__ == "__main__":
    raise SystemExit(main())
