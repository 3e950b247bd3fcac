"""Benchmark: a rolling update v1 → v2 across two Triton hosts under steady open-loop load.

What it runs, all real (see ``bench/stack.py``): PostgreSQL database ``modelyard_rbench_rolling``,
Redis as the Celery broker, the S3 stand-in, two tritonservers (hosts ``roll-a`` and ``roll-b``),
a Celery orchestrator and one agent per host. The API is called in process (DRF ``APIClient``).

1. Two versions of the demo iris model are registered (with the smoke-test sample input); v1 is
   deployed to both hosts and a few requests warm each host up.
2. A load generator (asyncio + aiohttp, in a thread of this process) sends ``--rate`` requests/s in
   total, alternating between the hosts, open loop: request ``i`` leaves at ``start + i / rate``
   whatever earlier answers did. Each is Triton's ``POST /v2/models/iris/infer`` naming no
   version, with the four sample flowers. A request succeeds when Triton answers 200; its latency
   runs from its scheduled send time to the end of the answer (so a late send counts against it).
3. ``--rollout-at`` seconds into the load, ``POST /api/v1/deployments/`` rolls v2 out with
   ``batch_size`` 1. The load runs at least ``--duration`` seconds in all, and at least
   ``--after`` seconds past the rollout's end.

Results: requests sent, failed (with the first errors), achieved rate (answers per second of the
load's span), latency p50/p99/max before the rollout, during it (API call → rollout finished) and
after it, which version answered in each phase, and the rollout's duration with each host's cut-over
time. Verdict: PASS when no request failed and the achieved rate is at least ``--target-rps``.

Usage::

    python bench/rolling_update.py --json bench/results/rolling_update.json \\
        --markdown bench/results/rolling_update.md
"""

import argparse
import asyncio
import json
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from stack import MODEL, RolloutStack, add_common_arguments, finish, log, machine, percentile

NAME = "rolling_update"
HOSTS = ("roll-a", "roll-b")
ERRORS_KEPT = 20
SLOW_MS = 100.0
SLOWEST_KEPT = 10
REPORT_DELAY_S = 0.1


@dataclass
class Record:
    """One request: host index, scheduled send (epoch s), send lag and latency (s), outcome."""

    host: int
    scheduled: float
    lag_s: float
    latency_s: float
    ok: bool
    version: str = ""
    error: str = ""


@dataclass
class LoadGenerator:
    """Open-loop load at ``rate`` requests/s over ``urls`` (in turn), in a thread with its own event loop.

    ``end_at`` (epoch s) is when the last request is scheduled; it may be moved later while the
    load runs. ``records`` holds every request once ``join`` returns.
    """

    urls: list[str]
    rate: float
    end_at: float
    body: bytes
    records: list[Record] = field(default_factory=list)
    started_at: float = 0.0
    finished_at: float = 0.0

    def start(self) -> None:
        """Start sending, from a new thread; returns at once."""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="load", daemon=True)
        self._thread.start()

    def join(self) -> None:
        """Wait until the last request scheduled before ``end_at`` has its answer (or error)."""
        self._thread.join()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        offset = time.time() - loop.time()  # loop clock -> epoch seconds
        connector = aiohttp.TCPConnector(limit=256)
        timeout = aiohttp.ClientTimeout(total=15)
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
            start = loop.time() + 0.05
            self.started_at = start + offset
            tasks, number = [], 0
            while True:
                at = start + number / self.rate
                if at + offset > self.end_at:
                    break
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                host = number % len(self.urls)
                tasks.append(asyncio.create_task(self._one(session, host, at, offset)))
                number += 1
            await asyncio.gather(*tasks)
        self.finished_at = time.time()

    async def _one(self, session: aiohttp.ClientSession, host: int, at: float, offset: float) -> None:
        loop = asyncio.get_running_loop()
        sent = loop.time()
        version, error, ok = "", "", False
        try:
            async with session.post(self.urls[host], data=self.body) as answer:
                text = await answer.read()
                if answer.status == 200:
                    ok, version = True, str(json.loads(text).get("model_version", ""))
                else:
                    error = f"HTTP {answer.status}: {text[:200].decode(errors='replace')}"
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        done = loop.time()
        self.records.append(Record(host, at + offset, sent - at, done - at, ok, version, error))


def request_body() -> bytes:
    """Triton's KServe v2 infer request for the four sample flowers, naming no version."""
    from demo.iris import SAMPLE_INPUT

    return json.dumps({
        "inputs": [{"name": "input", "shape": [len(SAMPLE_INPUT), 4], "datatype": "FP32",
                    "data": [x for row in SAMPLE_INPUT for x in row]}],
        "outputs": [{"name": "label"}],
    }).encode()


def phase_stats(records: list[Record]) -> dict:
    """Counts, failures, latency quantiles (ms) and versions answered for one phase's requests."""
    latencies = [r.latency_s * 1000 for r in records if r.ok]
    versions: dict[str, int] = {}
    for r in records:
        if r.ok:
            versions[r.version] = versions.get(r.version, 0) + 1

    def q(p):
        value = percentile(latencies, p)
        return None if value is None else round(value, 2)

    return {"requests": len(records), "failed": sum(not r.ok for r in records), "p50_ms": q(50), "p99_ms": q(99),
            "max_ms": round(max(latencies), 2) if latencies else None,
            f"over_{SLOW_MS:g}_ms": sum(latency > SLOW_MS for latency in latencies),
            "max_send_lag_ms": round(max((r.lag_s for r in records), default=0) * 1000, 2),
            "answered_by_version": dict(sorted(versions.items()))}


def rollout_timeline(deployment_id: int, started: float) -> dict:
    """Per host: when its target reached each state (seconds after the API call) and its agent steps."""
    from deployments.models import DeploymentTarget

    out = {}
    for target in DeploymentTarget.objects.filter(deployment_id=deployment_id).select_related("host"):
        out[target.host.name] = {
            "batch": target.batch, "state": target.state,
            "events_at_s": {e.to_state: round(e.created_at.timestamp() - started, 3) for e in target.events.all()},
            "steps_s": {k: v for k, v in target.details.items() if k.endswith("_seconds")},
        }
    return out


def run(args: argparse.Namespace) -> dict:
    """Start the stack, run the load and the rollout, and return the results (with the verdict) as a dict."""
    result: dict = {"benchmark": NAME, "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                    "machine": machine(), "hosts": list(HOSTS), "rate_rps": args.rate,
                    "target_rps": args.target_rps}
    result["through_gateway"] = args.gateway
    with RolloutStack(bench=NAME, database=args.database, broker_url=args.broker, hosts=HOSTS, keep=args.keep,
                      gateway=args.gateway) as stack:
        log(NAME, f"stack up in {stack.timings['start_s']} s")
        v1, v2 = stack.upload_iris(2)
        first = stack.deploy(v1, list(HOSTS), batch_size=len(HOSTS))
        if stack.wait_finished(first) != "succeeded":
            raise RuntimeError(f"the first deployment of v{v1} did not succeed")
        urls = [f"{stack.hosts[h].inference_url}/v2/models/{MODEL}/infer" for h in HOSTS]
        body = request_body()
        warm = LoadGenerator(urls, rate=20, end_at=time.time() + 1, body=body)
        warm.start()
        warm.join()
        if not all(r.ok for r in warm.records):
            raise RuntimeError(f"warm-up requests failed: {[r.error for r in warm.records if not r.ok][:3]}")

        result["load_average_1m_before"] = round(os.getloadavg()[0], 2)
        load = LoadGenerator(urls, rate=args.rate, end_at=time.time() + args.duration, body=body)
        load.start()
        log(NAME, f"load at {args.rate:g} requests/s; rollout v{v1} → v{v2} in {args.rollout_at:g} s")
        time.sleep(args.rollout_at)
        rollout_started = time.time()
        deployment = stack.deploy(v2, list(HOSTS), batch_size=1)
        status = stack.wait_finished(deployment, interval=0.05)
        rollout_finished = time.time()
        load.end_at = max(load.end_at, rollout_finished + args.after)
        log(NAME, f"rollout {status} in {rollout_finished - rollout_started:.1f} s; load until the end")
        load.join()
        result["load_average_1m_after"] = round(os.getloadavg()[0], 2)
        result["rollout"] = {"deployment": deployment, "status": status, "from_version": v1, "to_version": v2,
                             "batch_size": 1, "started_after_s": round(rollout_started - load.started_at, 2),
                             "duration_s": round(rollout_finished - rollout_started, 2),
                             "hosts": rollout_timeline(deployment, rollout_started)}
        result["stack"] = stack.timings

    records = sorted(load.records, key=lambda r: r.scheduled)
    span = load.finished_at - load.started_at
    ok = sum(r.ok for r in records)
    failed = [r for r in records if not r.ok]
    result["load"] = {
        "requests": len(records), "failed": len(failed), "succeeded": ok, "span_s": round(span, 2),
        "offered_rps": round(len(records) / (records[-1].scheduled - records[0].scheduled), 1),
        "achieved_rps": round(ok / span, 1), "first_errors": [r.error for r in failed[:ERRORS_KEPT]],
    }
    result["phases"] = {
        "before": phase_stats([r for r in records if r.scheduled < rollout_started]),
        "during": phase_stats([r for r in records if rollout_started <= r.scheduled <= rollout_finished]),
        "after": phase_stats([r for r in records if r.scheduled > rollout_finished]),
        "all": phase_stats(records),
    }
    # The agent reports "loading" just before loading v2 beside v1 and "verifying" once that load returned;
    # each report reaches the database a few tens of ms after it was sent, hence the earlier start.
    loads = {host: (t["events_at_s"].get("loading"), t["events_at_s"].get("verifying"))
             for host, t in result["rollout"]["hosts"].items()}
    result["slowest"] = []
    for r in sorted(records, key=lambda r: -r.latency_s)[:SLOWEST_KEPT]:
        at, (began, ended) = r.scheduled - rollout_started, loads.get(HOSTS[r.host], (None, None))
        result["slowest"].append({
            "at_s": round(at, 3), "host": HOSTS[r.host], "latency_ms": round(r.latency_s * 1000, 1),
            "send_lag_ms": round(r.lag_s * 1000, 1), "version": r.version, "error": r.error,
            "during_host_load": began is not None and ended is not None
            and began - REPORT_DELAY_S <= at <= ended,
        })
    achieved = result["load"]["achieved_rps"]
    passed = not failed and achieved >= args.target_rps and status == "succeeded"
    result["verdict"] = "pass" if passed else "fail"
    result["verdict_reason"] = (
        f"{len(failed)} of {len(records)} requests failed over {span:.0f} s at {achieved:g} answers/s "
        f"(target: 0 failed, ≥ {args.target_rps:g}/s) while v{v1} → v{v2} rolled out across {len(HOSTS)} hosts "
        f"one at a time in {result['rollout']['duration_s']:g} s ({status})"
    )
    result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    return result


def markdown(r: dict) -> str:
    """The results as the markdown report (bench/results/rolling_update.md)."""
    lo, ro = r["load"], r["rollout"]
    lines = [
        "# Rolling update under steady load", "",
        f"Run {r['finished_at']} on {r['machine']}. Command: `bench/run.sh "
        f"{NAME + '_gateway' if r.get('through_gateway') else NAME}`.", "",
        f"**Verdict: {r['verdict'].upper()}** — {r['verdict_reason']}", "",
        "## Setup", "",
        f"- Two serving hosts ({', '.join(r['hosts'])}), each its own tritonserver 2.51 (CPU) and host agent "
        "(`modelyard-agent`), "
        "on one machine with the rest of the stack (bench/stack.py): PostgreSQL, Redis, moto_server, a Celery "
        "orchestrator; the API called in process. The machine's 2 CPUs are shared with other work.",
        *(["- Clients reach each host through its **gateway**: the nginx its agent runs (`--triton-url`), the "
           "host's inference_url, in front of Triton; requests naming no version follow the route the agent "
           "sets at each cut-over, with no nginx reload."] if r.get("through_gateway") else []),
        "- Model: the demo iris classifier (python backend + onnxruntime, one CPU instance per version); each "
        "swap loads v2 beside v1, runs the smoke inference, then unloads v1.",
        f"- Load: open loop at {r['rate_rps']:g} requests/s in total (asyncio + aiohttp in the benchmark's "
        "process), alternating hosts, each request naming no version (4 rows); latency from the scheduled send "
        "time to the end of the answer.",
        f"- Rollout v{ro['from_version']} → v{ro['to_version']}, batch size 1, started {ro['started_after_s']} s "
        f"into the load; it took **{ro['duration_s']} s** ({ro['status']}).",
        f"- 1-minute load average {r['load_average_1m_before']} before, {r['load_average_1m_after']} after.", "",
        "## Results", "",
        f"- Requests: {lo['requests']} over {lo['span_s']} s, **{lo['failed']} failed**; offered "
        f"{lo['offered_rps']}/s, **achieved {lo['achieved_rps']} answers/s**.", "",
        f"| phase | requests | failed | p50 (ms) | p99 (ms) | max (ms) | over {SLOW_MS:g} ms | max send lag (ms) | "
        "answered by version |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for phase in ("before", "during", "after", "all"):
        p = r["phases"][phase]
        versions = ", ".join(f"v{v}: {n}" for v, n in p["answered_by_version"].items()) or "—"
        lines.append(f"| {phase} | {p['requests']} | {p['failed']} | {p['p50_ms']} | {p['p99_ms']} | {p['max_ms']} | "
                     f"{p[f'over_{SLOW_MS:g}_ms']} | {p['max_send_lag_ms']} | {versions} |")
    lines += ["", "'during' runs from the API call to the rollout's end; 'send lag' is how late the generator sent a "
              "request (on a busy machine it shows up in the latency too).", "",
              "## Rollout timeline (seconds after the API call)", "",
              "| host | batch | staging | loading | verifying | cutting over | ready | agent steps (s) |",
              "|---|---|---|---|---|---|---|---|"]
    for host, t in ro["hosts"].items():
        e = t["events_at_s"]
        steps = ", ".join(f"{k.removesuffix('_seconds')} {v}" for k, v in t["steps_s"].items())
        lines.append(f"| {host} | {t['batch']} | {e.get('staging', '—')} | {e.get('loading', '—')} | "
                     f"{e.get('verifying', '—')} | {e.get('cutting_over', '—')} | {e.get('ready', '—')} | {steps} |")
    lines += ["", f"## The {len(r['slowest'])} slowest requests", "",
              "| sent (s after the API call) | host | latency (ms) | send lag (ms) | answered by | "
              "sent while its host loaded v2 beside v1 |", "|---|---|---|---|---|---|"]
    lines += [f"| {x['at_s']} | {x['host']} | {x['latency_ms']} | {x['send_lag_ms']} | "
              f"{'v' + x['version'] if x['version'] else x['error']} | {'yes' if x['during_host_load'] else ''} |"
              for x in r["slowest"]]
    if any(x["during_host_load"] and x["latency_ms"] > 1000 for x in r["slowest"]):
        lines += ["", "A request that reaches Triton while a load adds a version (here in the first part of the "
                  "load) can wait for the whole load and be answered by the new version, before the agent's smoke "
                  "inference; the same happens when Triton's load API is called directly, outside the agent."]
    if lo["first_errors"]:
        lines += ["", "First errors:", "", *(f"- `{e}`" for e in lo["first_errors"])]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 whatever the verdict)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser, name=NAME, database="modelyard_rbench_rolling")
    parser.add_argument("--rate", type=float, default=120.0, help="requests/s in total (default 120)")
    parser.add_argument("--duration", type=float, default=65.0, help="seconds of load at least (default 65)")
    parser.add_argument("--rollout-at", type=float, default=20.0, help="seconds into the load (default 20)")
    parser.add_argument("--after", type=float, default=15.0, help="seconds of load past the rollout at least")
    parser.add_argument("--target-rps", type=float, default=100.0)
    parser.add_argument("--gateway", action="store_true",
                        help="clients go through each host's gateway (nginx run by its agent), not to Triton")
    args = parser.parse_args(argv)
    result = run(args)
    return finish(NAME, args, result, markdown(result))


if __name__ == "__main__":
    raise SystemExit(main())
