"""Weighted canaries on a BentoML host: split accuracy, and failed requests while the percent changes,
through a promotion and through a rollback.

Builds two Bentos of one scikit-learn classifier with BentoML itself and drives the host agent's own code
(``modelyard_agent.bentoml_host``: ``deploy_bentoml_version`` with ``canary_percent``, ``route_bentoml_model``,
a plain deploy of the canary's or the stable version) against real ``bentoml serve`` processes behind the
agent's real nginx, whose client keep-alive is on (``MODELYARD_AGENT_NGINX_KEEPALIVE=75``).

1. Accuracy: ``--requests`` requests that name no version, on ``--clients`` kept-alive sessions, at P = 10
   and P = 50; the observed share of the canary must be within 2 points of P.
2. Under closed-loop load from ``--clients`` kept-alive sessions: the percent changes ``--changes`` times,
   then the canary is promoted; a new canary starts, and is rolled back. Every failed request counts.

Verdict: PASS when both shares are within 2 points, no request failed, and the load ran at >= 100
requests/s in every phase.

    .venv/bin/python bench/bentoml_split.py --json bench/results/bentoml_split.json \
        --markdown bench/results/bentoml_split.md
"""

import argparse
import functools
import http.server
import json
import os
import platform
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelyard.settings")
os.environ["MODELYARD_AGENT_NGINX_KEEPALIVE"] = "75"

TOLERANCE = 2.0  # points of percent
MIN_RATE = 100.0  # requests per second


class Load:
    """Closed-loop client threads on kept-alive sessions; records (start, ok, version) per request."""

    def __init__(self, url: str, clients: int):
        self.url, self.samples, self.reasons = url, [], {}
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def _run(self) -> None:
        from modelyard_agent.runtimes.routes import VERSION_HEADER
        from tests.deployments.bentoml_host import SAMPLE

        with requests.Session() as session:
            while not self.stop.is_set():
                started, reason, version = time.monotonic(), "", None
                try:
                    answer = session.post(self.url, json=SAMPLE, timeout=30)
                    version = answer.headers.get(VERSION_HEADER)
                    reason = "" if answer.status_code == 200 else f"HTTP {answer.status_code}: {answer.text[:80]}"
                except requests.RequestException as exc:
                    reason = repr(exc)[:160]
                with self.lock:
                    self.samples.append((started, not reason, version))
                    if reason:
                        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def window(self, began: float, ended: float) -> dict:
        chosen = [s for s in self.samples if began <= s[0] <= ended]
        seconds = max(ended - began, 1e-9)
        versions = sorted({s[2] for s in chosen if s[2]})
        return {"requests": len(chosen), "failed": sum(1 for s in chosen if not s[1]), "seconds": round(seconds, 3),
                "rate_per_s": round(len(chosen) / seconds, 1), "versions": versions}


def run(args: argparse.Namespace) -> dict:
    import django

    django.setup()
    from modelyard_agent.bentoml_host import deploy_bentoml_version, route_bentoml_model
    from modelyard_agent.bentoml_instances import ServeState, front_for
    from modelyard_agent.runtimes import bentoml as serve
    from modelyard_agent.runtimes.routes import VERSION_HEADER
    from tests.deployments.bentoml_host import MODEL, SAMPLE, make_payload
    from tests.fixtures.services import free_port
    from tests.registry.format_builders import build_bentoml_exports

    work = Path(tempfile.mkdtemp(prefix="bentoml-split-"))
    built = {}
    for name in ("v1", "v2"):
        (work / name).mkdir()
        built[name] = build_bentoml_exports(work / name, MODEL)[1]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(work))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url, url = f"http://127.0.0.1:{server.server_address[1]}", f"http://127.0.0.1:{free_port()}"
    root = work / "agent"
    classify = f"{url}/{MODEL}/classify"

    def deploy(name: str, version: int, **fields) -> dict:
        result = deploy_bentoml_version({**make_payload(built[name], base_url, url, version), **fields}, root=root)
        assert result["state"] == "ready", result
        return result

    def route(percent: float, stable: int, canary: int) -> None:
        route_bentoml_model({"model": MODEL, "inference_url": url, "stable": stable, "canary": canary,
                             "percent": percent}, root=root)

    def share(percent: float) -> dict:
        def send(n: int) -> list[str]:
            with requests.Session() as session:
                return [session.post(classify, json=SAMPLE, timeout=30).headers.get(VERSION_HEADER) for _ in range(n)]

        with ThreadPoolExecutor(args.clients) as pool:
            answered = [v for chunk in pool.map(send, [args.requests // args.clients] * args.clients) for v in chunk]
        observed = 100.0 * answered.count("2") / len(answered)
        return {"percent": percent, "requests": len(answered), "canary_share": round(observed, 2),
                "error_points": round(observed - percent, 2), "within": abs(observed - percent) <= TOLERANCE}

    phases, accuracy = {}, []
    try:
        deploy("v1", 1)
        deploy("v2", 2, canary_percent=10)
        accuracy.append(share(10.0))
        route(50.0, 1, 2)
        accuracy.append(share(50.0))

        with Load(classify, args.clients) as load:
            time.sleep(args.pause)
            began = time.monotonic()
            for step in range(args.changes):
                route((10.0, 25.0, 50.0, 75.0, 90.0)[step % 5], 1, 2)
                time.sleep(args.pause / 2)
            phases["percent_changes"] = load.window(began, time.monotonic())
            began = time.monotonic()
            promote = deploy("v2", 2)  # promotion: every request to v2, then v1 stops
            time.sleep(args.pause / 2)
            phases["promote"] = {**load.window(began, time.monotonic()),
                                 "cutover_seconds": promote["details"].get("cutover_seconds")}
            deploy("v1", 3, canary_percent=50)  # a new canary beside v2 (the location is split already: no reload)
            time.sleep(args.pause)
            began = time.monotonic()
            rollback = deploy("v2", 2)  # rollback: every request to v2, then v3 stops
            time.sleep(args.pause / 2)
            phases["rollback"] = {**load.window(began, time.monotonic()),
                                  "cutover_seconds": rollback["details"].get("cutover_seconds")}
            whole = load.window(load.samples[0][0], time.monotonic())
            reasons = dict(load.reasons)
    finally:
        for roles in ServeState(root).read().values():
            for instance in roles.values():
                serve.stop_instance(instance)
        front_for(root, url).stop()
        server.shutdown()

    failed = whole["failed"]
    slow = [name for name, p in phases.items() if p["rate_per_s"] < MIN_RATE]
    ok = all(a["within"] for a in accuracy) and failed == 0 and not slow
    reason = (f"canary share {accuracy[0]['canary_share']} % at P=10 and {accuracy[1]['canary_share']} % at P=50 over "
              f"{accuracy[0]['requests']} requests each (target: within {TOLERANCE:g} points); {failed} of "
              f"{whole['requests']} requests failed under load through {args.changes} percent changes, a promotion "
              f"and a rollback, at {min(p['rate_per_s'] for p in phases.values())} requests/s or more "
              f"(target: 0 failed at >= {MIN_RATE:g}/s)")
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.node(),
        "cpus": os.cpu_count(), "python": platform.python_version(), "clients": args.clients,
        "accuracy": accuracy, "phases": phases, "whole_run": whole, "failure_reasons": reasons,
        "verdict": "pass" if ok else "fail", "verdict_reason": reason,
    }


def markdown(r: dict) -> str:
    lines = [
        "# BentoML weighted canary: split accuracy and requests through percent changes, promote, rollback", "",
        f"Run {r['when']} on {r['machine']}, {r['cpus']} CPUs, Python {r['python']}. "
        "Command: `bench/run.sh bentoml_split`.", "",
        f"**Verdict: {r['verdict'].upper()}** — {r['verdict_reason']}", "",
        "## Setup", "",
        "- One BentoML host on this machine: the agent's own functions, Debian's nginx with its Lua module, one "
        "`bentoml serve` per version (scikit-learn classifier Bentos built by BentoML 1.4).",
        f"- {r['clients']} client threads, each on one kept-alive connection (nginx keep-alive on: "
        "`MODELYARD_AGENT_NGINX_KEEPALIVE=75`). Requests name no version and send no routing key (random draw).",
        "- Percent changes, the promotion, the second canary's start and the rollback all go through the Lua "
        "route: no nginx reload. The first canary's start reloads once (plain to split location), before the load.",
        "",
        "## Split accuracy", "",
        "| P (%) | requests | canary share (%) | error (points) | within ±2 |", "|---|---|---|---|---|",
    ]
    for a in r["accuracy"]:
        lines.append(f"| {a['percent']:g} | {a['requests']} | {a['canary_share']} | {a['error_points']} | "
                     f"{'yes' if a['within'] else 'no'} |")
    lines += ["", "## Requests under load", "",
              "| phase | requests | failed | seconds | requests/s | versions answering |", "|---|---|---|---|---|---|"]
    for name, p in r["phases"].items():
        lines.append(f"| {name.replace('_', ' ')} | {p['requests']} | {p['failed']} | {p['seconds']} | "
                     f"{p['rate_per_s']} | {', '.join(p['versions'])} |")
    w = r["whole_run"]
    lines.append(f"| whole run (with the second canary's start) | {w['requests']} | {w['failed']} | {w['seconds']} | "
                 f"{w['rate_per_s']} | {', '.join(w['versions'])} |")
    if r["failure_reasons"]:
        lines += ["", "Failures: " + "; ".join(f"{n} × `{why}`" for why, n in r["failure_reasons"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8000, help="requests per accuracy measurement")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--changes", type=int, default=10, help="percent changes under load")
    parser.add_argument("--pause", type=float, default=2.0, help="seconds of load before and between steps")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(result))
    print(result["verdict_reason"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
