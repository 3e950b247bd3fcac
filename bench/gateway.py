"""Benchmark: what a Triton host's gateway costs, how exactly it splits, and whether clients notice a canary's
changes through it.

All real: one tritonserver (explicit model control, as the tests start it) with the demo iris model,
versions 1 and 2 deployed by the host agent's own code (``TritonHostAgent.deploy``), and the agent's
gateway (``runtimes.gateway.TritonGateway``: Debian's nginx with its Lua module) in front of it.

1. **Overhead.** Triton's own perf_analyzer, at the same concurrency, straight to Triton and through the
   gateway (with no route: passed as sent; with the model requiring an inference key, each request carrying
   one, target ≤ 0.02 ms p50 beside no route; with a 50 % route: drawn and rewritten by the Lua module; and
   with the model's request capture on at 10 %, which keeps a route to the serving version), ``--rounds``
   alternated rounds each; each side is compared with straight to Triton in the same round, and the
   median of those differences is judged. The route and the capture name the version Triton serves a
   request that names none (the newest), so every side reaches the same model instance. Targets: added
   p50 ≤ 0.2 ms, added p99 ≤ 1 ms, throughput ≥ 0.9× straight to Triton. A reference side in the same
   rounds, **bare nginx** (the same Debian nginx with nothing but ``proxy_pass`` to the same kept-alive
   upstream: no Lua, no routes), gives what one proxy hop costs on the machine, so the gateway's own
   cost is its difference from that. A second gateway with its measurement turned off (``measure=False``:
   no clock, no counters, no histogram) runs in the same rounds beside the agent's, so what measuring every
   request costs is the measured gateway's p50 less that one's. Target: ≤ 0.02 ms p50.
   Measured on two models: ``iris`` as the demo builds it (about
   0.4 ms, all of it on the CPUs that perf_analyzer and nginx share), and ``iris_device``, the same model
   waiting ``--device-ms`` (2 ms) in each execution first: the time a GPU model spends on its device,
   when the host's CPUs are free for the gateway.
2. **Split accuracy.** ``--split-requests`` requests naming no version through the gateway at 10 % and at
   50 %, counted by the ``X-Modelyard-Version`` each answer carries (checked against the answer's own
   ``model_version``). Target: within ±2 points of the percent.
3. **Swaps through the gateway.** Clients on kept-alive connections send requests naming no version for
   the whole phase, while the agent deploys a canary of version 2 at 10 %, moves it through 25, 50 and 75 %,
   promotes it, deploys a canary of version 3 at 20 % and rolls it back to version 2. Target: 0 failed
   requests at ≥ 100 requests/s.
4. **Reloads under keep-alive clients.** The same clients while the gateway is reloaded ``--reloads``
   times (nginx ``-s reload``, as a changed gateway config is applied: an upgraded agent, gRPC turned
   on). Deployments never reload the gateway; this measures what an operator's change costs clients.
   Target: 0 failed requests.

Nothing here asserts anything; the verdict is in the results.

Usage::

    python bench/gateway.py --json bench/results/gateway.json --markdown bench/results/gateway.md
"""

import argparse
import functools
import hashlib
import http.server
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from stack import REPO, add_common_arguments, finish, log, machine

from tests.fixtures.services import free_port
from tests.fixtures.triton import START_ATTEMPTS, _launch

NAME = "gateway"


def iris_body() -> dict:
    """A KServe v2 request body for the iris model: the demo's sample input, asking for its labels."""
    from demo.iris import SAMPLE_INPUT

    return {"inputs": [{"name": "input", "shape": [len(SAMPLE_INPUT), 4], "datatype": "FP32",
                        "data": [float(x) for row in SAMPLE_INPUT for x in row]}], "outputs": [{"name": "label"}]}

DEVICE_MODEL = "iris_device"
# The paths each overhead round measures, straight to Triton first (the baseline of the others); the bare nginx
# side is a reference and not judged.
SIDES = ("triton", "nginx_bare", "gateway_unmeasured", "gateway", "gateway_keyed", "gateway_routed",
         "gateway_captured")
JUDGED = ("gateway", "gateway_keyed", "gateway_routed", "gateway_captured")
# The inference key the keyed side's clients send (the gateway holds its SHA-256 alone).
BENCH_KEY = "myk_benchkey_" + "b" * 43
SERVED = 2  # the version each side reaches: the newest, which Triton serves a request that names none

# The reference proxy: Debian's nginx with the gateway's own client and proxy settings, and nothing between the
# client and Triton's kept-alive upstream but proxy_pass.
_BARE_NGINX = """\
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
{client_settings}
{temp_paths}
    upstream triton {{
        server {triton} max_fails=0;
        keepalive 64;
    }}
    server {{
        listen {listen} backlog=4096;
{proxy_settings}
        location = /healthz {{ return 200 "ok\\n"; }}
        location / {{ proxy_pass http://triton; }}
    }}
}}
"""


def bare_nginx(directory: Path, triton: str, workers: str):
    """A started reference nginx at a free loopback port passing everything to ``triton`` (host:port); its
    ``NginxProcess`` (call ``stop()``)."""
    from modelyard_agent.runtimes.gateway import PROXY_SETTINGS, client_settings
    from modelyard_agent.runtimes.nginx_process import TEMP_PATHS, NginxProcess

    class BareNginx(NginxProcess):
        def main_config(self) -> str:
            return _BARE_NGINX.format(workers=workers, dir=self.dir, temp_paths=TEMP_PATHS.format(dir=self.dir),
                                      client_settings=client_settings(), proxy_settings=PROXY_SETTINGS,
                                      triton=triton, listen=self.listen)

    proxy = BareNginx(directory, free_port(), "127.0.0.1")
    proxy.ensure_running()
    return proxy


TARGETS = {"added_p50_ms": 0.2, "added_p99_ms": 1.0, "throughput_ratio": 0.9, "split_points": 2.0, "rate": 100,
           "measurement_p50_ms": 0.02, "key_check_p50_ms": 0.02}


def perf(binary: str, address: str, concurrency: int, args, workdir: Path, tag: str, input_file: Path,
         model: str = "iris", headers: tuple[str, ...] = ()) -> dict:
    """One perf_analyzer level against ``address`` (host:port) for ``model``, naming no version; its CSV row.

    perf_analyzer's stability rule is ``--stability`` % over 3 windows, up to 20 windows; a level it cannot
    measure stably on a busy machine is tried once more with windows twice as long.
    """
    from modelyard_agent.profiling.perf_analyzer import LoadGeneratorError, read_csv, run

    for attempt, window in enumerate((args.window_ms, 2 * args.window_ms)):
        csv_path = workdir / f"perf-{tag}-{attempt}.csv"
        command = [binary, "-m", model, "-u", address, "-i", "http", "-b", "1",
                   "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-interval", str(window),
                   "--stability-percentage", str(args.stability), "--max-trials", "20", "-f", str(csv_path),
                   "--input-data", str(input_file), *(arg for header in headers for arg in ("-H", header))]
        try:
            run(command, deadline=time.monotonic() + 300, should_stop=lambda: None,
                log_path=workdir / f"perf-{tag}-{attempt}.log")
            return {**read_csv(csv_path), "window_ms": window}
        except LoadGeneratorError:
            if attempt:
                raise
            log(NAME, f"{tag}: no stable measurement in {window} ms windows; once more with {2 * window} ms")


def split(url: str, count: int, workers: int = 4) -> dict:
    """Send ``count`` requests naming no version over ``workers`` kept-alive connections; count versions."""
    body = iris_body()

    def send(n: int) -> list[str]:
        seen = []
        with requests.Session() as session:
            for _ in range(n):
                answer = session.post(f"{url}/v2/models/iris/infer", json=body, timeout=30)
                header = answer.headers.get("X-Modelyard-Version")
                seen.append(header if header == answer.json().get("model_version") else f"mismatch:{header}")
        return seen

    with ThreadPoolExecutor(workers) as pool:
        versions = [v for chunk in pool.map(send, [count // workers] * workers) for v in chunk]
    return {v: versions.count(v) for v in sorted(set(versions))}


def build_device_archive(workdir: Path, name: str, device_ms: float) -> Path:
    """The demo iris model as ``name``, whose each execution first waits ``device_ms`` milliseconds without
    using a CPU (the time a GPU model's kernels take); a ``.tar.gz`` under ``workdir``."""
    import tarfile

    from demo.iris import build_iris_model_dir

    model_dir = build_iris_model_dir(workdir / f"{name}-dir", name=name)
    source = model_dir / "1" / "model.py"
    marker = "        responses = []\n"
    text = source.read_text()
    if marker not in text:
        raise RuntimeError(f"{source} has no {marker!r} to add the wait before")
    source.write_text(text.replace(marker, f"        __import__('time').sleep({device_ms / 1000!r})\n{marker}", 1))
    archive = workdir / f"{name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(model_dir, arcname=name)
    return archive


class Clients:
    """Threads on kept-alive connections sending requests that name no version; failures and versions kept."""

    def __init__(self, url: str, count: int):
        self.url, self.body = f"{url}/v2/models/iris/infer", iris_body()
        self.failures, self.count, self.stop = [], 0, threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def _run(self) -> None:
        with requests.Session() as session:
            while not self.stop.is_set():
                try:
                    answer = session.post(self.url, json=self.body, timeout=30)
                    if answer.status_code != 200:
                        self.failures.append(f"HTTP {answer.status_code}: {answer.text[:120]}")
                except requests.RequestException as exc:
                    self.failures.append(repr(exc)[:200])
                with self.lock:
                    self.count += 1


def run(args: argparse.Namespace) -> dict:
    from stack import _triton_install

    from demo.iris import SAMPLE_INPUT, build_iris_archive, build_iris_model_dir
    from modelyard_agent import config
    from modelyard_agent.formats.archives import sha256_file

    binary = str(REPO / ".stack" / "bin" / "perf_analyzer")
    if not Path(binary).exists():
        raise RuntimeError(f"{binary} is missing: run scripts/install_perf_analyzer.sh (make install)")
    workdir = Path(tempfile.mkdtemp(prefix="modelyard-bench-gateway-"))
    # nginx's workers (nobody, under root) spool request bodies and write the capture below it, and a
    # root agent's nginx refuses to start under a directory they cannot traverse.
    workdir.chmod(0o711)
    repository = workdir / "repository"
    repository.mkdir()
    install = _triton_install()
    triton = next((t for t in (_launch(install, repository, workdir / "triton.log", [])
                               for _ in range(START_ATTEMPTS)) if t is not None), None)
    if triton is None:
        raise RuntimeError("tritonserver could not get free ports")
    served = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(workdir)))
    threading.Thread(target=served.serve_forever, daemon=True).start()
    os.environ.update({"MODELYARD_AGENT_MODEL_REPOSITORY": str(repository),
                       "MODELYARD_AGENT_STAGING_DIR": str(workdir / "staging"),
                       "MODELYARD_AGENT_TRITON_URL": triton.http_url})
    config.current.cache_clear()
    from modelyard_agent.adapters.triton import TritonHostAgent, triton_gateway

    gateway_url = f"http://127.0.0.1:{free_port()}"
    gateway = triton_gateway(gateway_url)
    bare = bare_nginx(workdir / "bare-nginx", triton.http_url.removeprefix("http://"), gateway.workers)
    from modelyard_agent.runtimes.gateway import TritonGateway

    unmeasured = TritonGateway(workdir / "gateway-unmeasured", free_port(), listen_host="127.0.0.1",
                               triton=triton.http_url.removeprefix("http://"), workers=gateway.workers,
                               measure=False)
    unmeasured.ensure_running()
    agent = TritonHostAgent()
    try:
        archives = {"iris": build_iris_archive(workdir / "iris.tar.gz", name="iris"),
                    DEVICE_MODEL: build_device_archive(workdir, DEVICE_MODEL, args.device_ms)}
        config_text = (build_iris_model_dir(workdir / "unpacked", name="iris") / "config.pbtxt").read_text()

        def deploy(version: int, model: str = "iris", **fields) -> float:
            archive = archives[model]
            sha256, size = sha256_file(archive)
            payload = {"target_id": version, "host": "bench", "model": model, "version": version,
                       "artifact_url": f"http://127.0.0.1:{served.server_address[1]}/{archive.name}",
                       "sha256": sha256, "size": size, "config_text": config_text.replace('"iris"', f'"{model}"'),
                       "parameters": {"EXECUTION_ENV_PATH": str(triton.execution_env)},
                       "inference_url": gateway_url, "metrics_url": "", **fields}
            started = time.monotonic()
            result = agent.deploy(payload, report=lambda state: None)
            if result["state"] != "ready":
                raise RuntimeError(f"{model} v{version} did not deploy: {result.get('error')}")
            return time.monotonic() - started

        for model in archives:
            deploy(1, model)
            deploy(2, model, canary_percent=0)
        input_file = workdir / "input.json"
        input_file.write_text(json.dumps({"data": [{"input": {"content": row, "shape": [4]}} for row in SAMPLE_INPUT]}))
        addresses = {"triton": triton.http_url.removeprefix("http://"), "nginx_bare": f"127.0.0.1:{bare.listen_port}",
                     "gateway_unmeasured": f"127.0.0.1:{unmeasured.listen_port}"}

        # 1. Overhead, alternated rounds, per model.
        overhead = []
        for model in archives:
            for concurrency in args.concurrency:
                rounds = {side: [] for side in SIDES}
                for round_number in range(args.rounds):
                    log(NAME, f"overhead of {model} at concurrency {concurrency}, round {round_number + 1}")
                    for side in SIDES:
                        address = addresses.get(side, gateway_url.removeprefix("http://"))
                        if side == "gateway_routed":
                            gateway.set_route(model, stable=SERVED, canary=SERVED, percent=50)
                        elif side == "gateway_keyed":
                            gateway.remove_route(model)
                            gateway.set_inference_keys({model: [hashlib.sha256(BENCH_KEY.encode()).hexdigest()]})
                        elif side == "gateway_captured":
                            gateway.set_route(model, stable=SERVED)
                            gateway.set_capture(model, fraction=0.1, max_bytes=256 << 20, retention_seconds=3600)
                        else:
                            gateway.remove_route(model)
                        headers = (f"Authorization:Bearer {BENCH_KEY}",) if side == "gateway_keyed" else ()
                        rounds[side].append(perf(binary, address, concurrency, args, workdir,
                                                 f"{side}-{model}-{concurrency}-{round_number}", input_file, model,
                                                 headers))
                        if side == "gateway_keyed":
                            gateway.set_inference_keys({model: None})
                        if side == "gateway_captured":
                            gateway.set_capture(model, fraction=0, max_bytes=0, retention_seconds=3600)
                gateway.remove_route(model)
                medians = {side: {key: statistics.median(r[key] for r in rows)
                                  for key in ("throughput", "p50_ms", "p99_ms")} for side, rows in rounds.items()}
                row = {"model": model, "concurrency": concurrency, "medians": medians, "rounds": rounds}
                # Paired within each round (the side against straight to Triton minutes apart, not across the
                # whole run), then the median over rounds: slow drift of the shared machine cancels out.
                for side in SIDES[1:]:
                    pairs = list(zip(rounds[side], rounds["triton"], strict=True))
                    row[side] = {
                        "added_p50_ms": round(statistics.median(a["p50_ms"] - b["p50_ms"] for a, b in pairs), 4),
                        "added_p99_ms": round(statistics.median(a["p99_ms"] - b["p99_ms"] for a, b in pairs), 4),
                        "throughput_ratio": round(statistics.median(a["throughput"] / b["throughput"]
                                                                    for a, b in pairs), 3)}
                # What measuring costs: the agent's gateway less the unmeasured one, both without a route.
                row["measurement_p50_ms"] = round(statistics.median(
                    a["p50_ms"] - b["p50_ms"] for a, b in zip(rounds["gateway"], rounds["gateway_unmeasured"],
                                                               strict=True)), 4)
                # What the inference key check costs: the keyed side less the same gateway without keys.
                row["key_check_p50_ms"] = round(statistics.median(
                    a["p50_ms"] - b["p50_ms"] for a, b in zip(rounds["gateway_keyed"], rounds["gateway"],
                                                               strict=True)), 4)
                overhead.append(row)

        # 2. Split accuracy.
        accuracy = []
        for percent in (10, 50):
            gateway.set_route("iris", stable=1, canary=2, percent=percent)
            log(NAME, f"split at {percent} % over {args.split_requests} requests")
            counts = split(gateway_url, args.split_requests)
            total = sum(counts.values())
            observed = 100 * counts.get("2", 0) / total
            accuracy.append({"percent": percent, "requests": total, "counts": counts,
                             "observed_percent": round(observed, 2), "error_points": round(observed - percent, 2)})
        gateway.remove_route("iris")
        deploy(1)  # back to version 1 alone

        # 3. Swaps through the gateway.
        clients = Clients(gateway_url, args.clients)
        for thread in clients.threads:
            thread.start()
        time.sleep(1)
        steps, started = [], time.monotonic()

        def step(what: str, action) -> None:
            began = time.monotonic()
            action()
            steps.append({"step": what, "seconds": round(time.monotonic() - began, 3)})
            time.sleep(args.dwell)

        step("canary v2 at 10 %", lambda: deploy(2, canary_percent=10))
        for percent in (25, 50, 75):
            step(f"canary at {percent} %", lambda p=percent: agent.route(
                {"model": "iris", "inference_url": gateway_url, "stable": 1, "canary": 2, "percent": p}))
        step("promote v2", lambda: deploy(2))
        step("canary v3 at 20 %", lambda: deploy(3, canary_percent=20))
        step("roll back to v2", lambda: deploy(2))
        elapsed = time.monotonic() - started
        swaps = {"requests": clients.count, "seconds": round(elapsed, 1), "rate": round(clients.count / elapsed, 1),
                 "failures": len(clients.failures), "failure_samples": clients.failures[:10], "steps": steps}

        # 4. Graceful reloads under the same kept-alive clients.
        before_count, before_failures, began = clients.count, len(clients.failures), time.monotonic()
        for number in range(args.reloads):
            log(NAME, f"reload {number + 1} of {args.reloads} under {args.clients} kept-alive clients")
            gateway.reload()
            time.sleep(args.reload_gap)
        reload_seconds = time.monotonic() - began
        clients.stop.set()
        for thread in clients.threads:
            thread.join(30)
        reload_failures = clients.failures[before_failures:]
        reloads = {"reloads": args.reloads, "requests": clients.count - before_count,
                   "seconds": round(reload_seconds, 1),
                   "rate": round((clients.count - before_count) / reload_seconds, 1),
                   "failures": len(reload_failures), "failure_samples": reload_failures[:10]}
    finally:
        gateway.stop()
        unmeasured.stop()
        bare.stop()
        served.shutdown()
        triton.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    checks = []
    for model in archives:
        rows = [row for row in overhead if row["model"] == model]
        worst = {key: max(row[side][key] for row in rows for side in JUDGED)
                 for key in ("added_p50_ms", "added_p99_ms")}
        worst_ratio = min(row[side]["throughput_ratio"] for row in rows for side in JUDGED)
        checks += [
            (worst["added_p50_ms"] <= TARGETS["added_p50_ms"], f"{model}: added p50 at most "
             f"{worst['added_p50_ms']:.3f} ms (target ≤ {TARGETS['added_p50_ms']} ms)"),
            (worst["added_p99_ms"] <= TARGETS["added_p99_ms"], f"{model}: added p99 at most "
             f"{worst['added_p99_ms']:.3f} ms (target ≤ {TARGETS['added_p99_ms']} ms)"),
            (worst_ratio >= TARGETS["throughput_ratio"], f"{model}: throughput at least {worst_ratio}× straight "
             f"to Triton (target ≥ {TARGETS['throughput_ratio']}×)"),
        ]
    # Not judged: what a proxy hop costs here (bare nginx against straight to Triton), and what the gateway adds
    # to that hop (the gateway's sides against bare nginx).
    reference = []
    for model in archives:
        rows = [row for row in overhead if row["model"] == model]
        hop = {key: max(row["nginx_bare"][key] for row in rows) for key in ("added_p50_ms", "added_p99_ms")}
        own = max(row[side]["added_p50_ms"] - row["nginx_bare"]["added_p50_ms"] for row in rows for side in JUDGED)
        reference.append(
            f"{model}: bare nginx adds at most {hop['added_p50_ms']:.3f} ms p50 and {hop['added_p99_ms']:.3f} ms "
            f"p99, at least {min(row['nginx_bare']['throughput_ratio'] for row in rows)}× throughput; the "
            f"gateway's sides add at most {own:.3f} ms p50 to bare nginx")
    measurement = max(row["measurement_p50_ms"] for row in overhead)
    checks.append((measurement <= TARGETS["measurement_p50_ms"], f"measuring every request adds at most "
                   f"{measurement:.3f} ms p50 to the gateway without it (target ≤ {TARGETS['measurement_p50_ms']} ms)"))
    key_check = max(row["key_check_p50_ms"] for row in overhead)
    checks.append((key_check <= TARGETS["key_check_p50_ms"], f"checking an inference key adds at most "
                   f"{key_check:.3f} ms p50 to the gateway without keys (target ≤ {TARGETS['key_check_p50_ms']} ms)"))
    worst_split = max(abs(a["error_points"]) for a in accuracy)
    checks += [
        (worst_split <= TARGETS["split_points"], f"split within {worst_split:.2f} points "
                                                 f"(target ±{TARGETS['split_points']:g})"),
        (swaps["failures"] == 0 and swaps["rate"] >= TARGETS["rate"],
         f"{swaps['failures']} failed of {swaps['requests']} requests at {swaps['rate']:.0f}/s through a canary, "
         f"its percent changes, a promotion and a rollback"),
        (reloads["failures"] == 0, f"{reloads['failures']} failed of {reloads['requests']} requests on kept-alive "
                                   f"connections through {reloads['reloads']} reloads"),
    ]
    return {"benchmark": NAME, "machine": machine(), "verdict": "PASS" if all(ok for ok, _ in checks) else "FAIL",
            "verdict_reason": "; ".join(reason for _, reason in checks), "checks": [
                {"passed": ok, "what": reason} for ok, reason in checks], "reference": reference, "targets": TARGETS,
            "window_ms": args.window_ms, "stability": args.stability, "rounds": args.rounds,
            "device_ms": args.device_ms, "overhead": overhead, "split": accuracy, "swaps": swaps, "reloads": reloads}


def markdown(r: dict) -> str:
    lines = [f"# {NAME}", "", f"**Verdict: {r['verdict']}**", ""]
    lines += [f"- {'PASS' if check['passed'] else 'FAIL'}: {check['what']}" for check in r["checks"]]
    lines += [f"- reference, not judged: {line}" for line in r.get("reference", [])]
    lines += ["", f"Machine: {r['machine']} (Triton, nginx, perf_analyzer and the clients share its CPUs). "
              f"perf_analyzer windows of {r['window_ms']} ms (twice that where a level was not stable) with its "
              f"stability rule ({r['stability']} % over 3 windows); {r['rounds']} alternated rounds: the infer/s and "
              "latency columns are medians over rounds, the added and ratio columns medians of each round's "
              "difference from straight to Triton in that round.", "",
              "## Overhead: perf_analyzer straight to Triton and through the gateway", "",
              f"`iris` is the demo model as built (its time is all on the CPUs nginx shares); `{DEVICE_MODEL}` "
              f"waits {r['device_ms']:g} ms in each execution first, as a GPU model's kernels keep it waiting "
              "with the CPUs free. \"50 % route\" draws each request for a canary and rewrites it to a version (both "
              "halves to the version straight-to-Triton requests reach, so all sides use the same model instance); "
              "\"capture 10 %\" is the model's request capture on at fraction 0.1 (with the route to the serving "
              "version that capture keeps). \"bare nginx\" is the same nginx with only `proxy_pass` (no Lua): what "
              "one proxy hop costs on this machine. \"unmeasured\" is a second gateway with its traffic measurement "
              "off (no clock, counters or histogram): the gateway's rows less it are what measuring costs. \"inference "
              "key\" is the model requiring a key, each request carrying one (hashed and looked up, the header "
              "removed): its row less \"no route\" is what the check costs.", "",
              "| model | concurrency | path | infer/s | p50 ms | p99 ms | added p50 ms | added p99 ms "
              "| throughput ratio |",
              "|---|---|---|---|---|---|---|---|---|"]
    labels = {"triton": "straight to Triton", "nginx_bare": "bare nginx (reference)",
              "gateway_unmeasured": "gateway, no route, unmeasured (reference)", "gateway": "gateway, no route",
              "gateway_keyed": "gateway, no route, inference key", "gateway_routed": "gateway, 50 % route",
              "gateway_captured": "gateway, capture 10 %"}
    for row in r["overhead"]:
        for side, label in labels.items():
            m = row["medians"][side]
            extra = row.get(side) or {}
            lines.append(f"| {row['model']} | {row['concurrency']} | {label} | {m['throughput']:,.0f} | "
                         f"{m['p50_ms']:.3f} | {m['p99_ms']:.3f} | {extra.get('added_p50_ms', '—')} | "
                         f"{extra.get('added_p99_ms', '—')} | {extra.get('throughput_ratio', '—')} |")
    lines += ["", "## Split accuracy", "", "| percent | requests | answers per version | observed % | error (points) |",
              "|---|---|---|---|---|"]
    for a in r["split"]:
        lines.append(f"| {a['percent']} | {a['requests']:,} | {a['counts']} | {a['observed_percent']} | "
                     f"{a['error_points']:+.2f} |")
    s = r["swaps"]
    lines += ["", "## Swaps through the gateway", "",
              f"{s['requests']:,} requests in {s['seconds']} s ({s['rate']:.0f}/s) on kept-alive connections; "
              f"**{s['failures']} failed**.", "", "| step | seconds |", "|---|---|"]
    lines += [f"| {step['step']} | {step['seconds']} |" for step in s["steps"]]
    if s["failure_samples"]:
        lines += ["", "Failures:", ""] + [f"- `{f}`" for f in s["failure_samples"]]
    lines += ["", "Percent changes need no nginx reload (the routes live in the gateway's shared memory), so no "
              "kept-alive connection is closed under a client."]
    rl = r["reloads"]
    lines += ["", "## Reloads under kept-alive clients", "",
              f"{rl['reloads']} graceful reloads (`nginx -s reload`, as a changed gateway config is applied) while "
              f"the same clients sent {rl['requests']:,} requests in {rl['seconds']} s ({rl['rate']:.0f}/s) on "
              f"kept-alive connections: **{rl['failures']} failed**."]
    if rl["failure_samples"]:
        lines += ["", "Failures:", ""] + [f"- `{f}`" for f in rl["failure_samples"]]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_arguments(parser, name=NAME, database="modelyard_bench_gateway")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4], help="perf_analyzer levels")
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds per level (default 5)")
    parser.add_argument("--window-ms", type=int, default=3000, help="perf_analyzer measurement window")
    parser.add_argument("--stability", type=int, default=50, help=(
        "perf_analyzer's stability percentage (the comparison rests on medians of alternated rounds, not on it)"))
    parser.add_argument("--split-requests", type=int, default=6000, help="requests per split percent")
    parser.add_argument("--clients", type=int, default=4, help="client threads during the swaps")
    parser.add_argument("--dwell", type=float, default=2.0, help="seconds between two swap steps")
    parser.add_argument("--device-ms", type=float, default=2.0, help=(
        f"milliseconds {DEVICE_MODEL} waits in each execution, standing in for a GPU's kernels (default 2)"))
    parser.add_argument("--reloads", type=int, default=20, help="graceful reloads under the clients (default 20)")
    parser.add_argument("--reload-gap", type=float, default=0.5, help="seconds between two reloads")
    args = parser.parse_args(argv)
    result = run(args)
    return finish(NAME, args, result, markdown(result))


if __name__ == "__main__":
    raise SystemExit(main())
