"""What the promotion tests share: a Prometheus fed known counters, the registry rows, a webhook receiver.

The served Triton exposition has four versions of ``iris`` answering requests at known rates:

| version | requests/s | failures/s | p95 latency |
|---|---|---|---|
| 1 (production) | 20 | 0 | 10 ms |
| 2 (a good candidate) | 20 | 0 | 10.5 ms |
| 3 (a bad candidate) | 19 | 1 | 30 ms |
| 4 (a quiet candidate) | 0.01 | 0 | 10 ms |

Prometheus holds three minutes of that history (written with promtool) and keeps scraping it.
"""

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from deployments.choices import DeploymentStatus, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from monitoring.prometheus import PrometheusClient
from registry.choices import ArtifactFormat
from registry.models import Alias, ModelVersion, RegisteredModel
from tests.fixtures.expositions import ServedExposition
from tests.fixtures.services import launch_prometheus, wait_for
from tests.monitoring.synthetic import write_history

# version: (successes/s, failures/s, p95 µs)
RATES = {"1": (20, 0, 10_000), "2": (20, 0, 10_500), "3": (19, 1, 30_000), "4": (0.01, 0, 10_000)}
HISTORY_SECONDS = 180


def exposition(started: float, at: float | None = None) -> str:
    """The Triton exposition as scraped at ``at`` (unix seconds, default now) from a server up since ``started``."""
    t = (time.time() if at is None else at) - started
    lines = ["# TYPE nv_inference_request_success counter", "# TYPE nv_inference_request_failure counter",
             "# TYPE nv_inference_request_summary_us summary"]
    for version, (ok, bad, p95_us) in RATES.items():
        labels = f'model="iris",version="{version}"'
        lines.append(f"nv_inference_request_success{{{labels}}} {ok * t:.3f}")
        lines.append(f'nv_inference_request_failure{{{labels},reason="BACKEND"}} {bad * t:.3f}')
        lines.append(f'nv_inference_request_summary_us{{{labels},quantile="0.5"}} {p95_us / 2}')
        lines.append(f'nv_inference_request_summary_us{{{labels},quantile="0.95"}} {p95_us}')
    return "\n".join(lines) + "\n"


def bento_exposition(started: float, at: float | None = None) -> str:
    """The same four versions as BentoML processes would report them, as Prometheus stores them once each
    version's scrape target (``/_metrics/iris/<v>``) has attached ``model`` and ``version``: requests by
    endpoint and status code (health probes too, which must be left out) and the request duration
    histogram, whose 0.95 quantile is the version's p95."""
    t = (time.time() if at is None else at) - started
    # Bucket bounds (s) with an edge at each version's p95, as a histogram configured for these SLOs would have.
    bounds = sorted({0.005, 0.01, 0.025, 0.05, 0.1} | {p95_us / 1e6 for _, _, p95_us in RATES.values()})
    lines = ["# TYPE bentoml_service_request_total counter",
             "# TYPE bentoml_service_request_duration_seconds histogram"]
    for version, (ok, bad, p95_us) in RATES.items():
        labels = f'model="iris",version="{version}",service_name="iris"'
        ok_n, bad_n = ok * t, bad * t
        total, p95 = ok_n + bad_n, p95_us / 1e6
        lines.append(f'bentoml_service_request_total{{{labels},endpoint="/classify",http_response_code="200"}} '
                     f"{ok_n:.3f}")
        lines.append(f'bentoml_service_request_total{{{labels},endpoint="/classify",http_response_code="500"}} '
                     f"{bad_n:.3f}")
        lines.append(f'bentoml_service_request_total{{{labels},endpoint="/readyz",http_response_code="200"}} {t:.3f}')
        # Durations spread evenly up to the p95, and the slowest 5 % in the bucket above it.
        for bound in bounds:
            count = total * 0.95 * min(1.0, bound / p95) if bound <= p95 else total
            lines.append(f'bentoml_service_request_duration_seconds_bucket{{{labels},endpoint="/classify",'
                         f'le="{bound}"}} {count:.3f}')
        lines.append(f'bentoml_service_request_duration_seconds_bucket{{{labels},endpoint="/classify",le="+Inf"}} '
                     f"{total:.3f}")
        lines.append(f'bentoml_service_request_duration_seconds_sum{{{labels},endpoint="/classify"}} '
                     f"{total * p95 * 0.6:.6f}")
        lines.append(f'bentoml_service_request_duration_seconds_count{{{labels},endpoint="/classify"}} {total:.3f}')
    return "\n".join(lines) + "\n"


class FedPrometheus:
    """A real Prometheus holding the history of an exposition (``exposition``, Triton's, or
    ``bento_exposition``) and scraping it every second."""

    def __init__(self, workdir, source=exposition,
                 ready_query: str = 'count by (version)(nv_inference_request_success{model="iris"})'):
        started = time.time() - 3600
        self.served = ServedExposition(lambda: source(started))
        tsdb = workdir / "tsdb"
        tsdb.mkdir()
        write_history(tsdb, [(lambda t: source(started, t), {"job": "serving", "instance": self.served.target,
                                                            "host": "gpu-a"})],
                      seconds=HISTORY_SECONDS, end=time.time(), step=1)
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [{"job_name": "serving", "static_configs": [
            {"targets": [self.served.target], "labels": {"host": "gpu-a"}}]}]}
        self.service = launch_prometheus(config, workdir, tsdb)
        self.url = self.service.url
        self.client = PrometheusClient(self.url)
        wait_for(lambda: len(self.client.instant(ready_query)) == len(RATES), timeout=40,
                 what="Prometheus to hold the versions' series")

    def stop(self) -> None:
        """Stop Prometheus and the exposition."""
        self.service.stop()
        self.served.stop()


def iris_with_aliases(artifact_format: str = ArtifactFormat.TRITON_MODEL_DIR, **aliases: int) -> RegisteredModel:
    """Register ``iris`` with versions 1-4 in ``artifact_format`` (artifacts never stored) and the given aliases,
    e.g. production=1."""
    model = RegisteredModel.objects.create(name="iris", next_version=len(RATES) + 1)
    for number in range(1, len(RATES) + 1):
        ModelVersion.objects.create(model=model, version=number, format=artifact_format,
                                    artifact_key=f"iris-{number}", artifact_sha256=f"{number:064d}", artifact_size=1)
    for alias, number in aliases.items():
        Alias.objects.create(model=model, name=alias, version=model.versions.get(version=number))
    return model


def following(model: RegisteredModel, alias: str, host_names: list[str]) -> Deployment:
    """Record that ``alias``'s version serves on ``host_names`` through a deployment that follows it."""
    version = Alias.objects.get(model=model, name=alias).version
    deployment = Deployment.objects.create(model=model, version=version, follow_alias=alias,
                                           status=DeploymentStatus.SUCCEEDED)
    for name in host_names:
        host, _ = ServingHost.objects.get_or_create(name=name, defaults={"inference_url": f"http://{name}:8000"})
        DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY)
    return deployment


class WebhookReceiver:
    """A webhook receiver on 127.0.0.1 that checks each request's signature with ``secret``.

    The first request it gets is answered 503 (so the sender must retry); later ones 200.
    ``received`` holds ``{"event", "body" (parsed), "signature_ok", "attempt"}`` per request.
    """

    def __init__(self, secret: str):
        self.secret = secret
        self.received: list[dict] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                timestamp = self.headers.get("X-Modelyard-Timestamp", "")
                expected = "sha256=" + hmac.new(receiver.secret.encode(), timestamp.encode() + b"." + raw,
                                                hashlib.sha256).hexdigest()
                fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) < 300
                with receiver._lock:
                    first = not receiver.received
                    receiver.received.append({
                        "event": self.headers.get("X-Modelyard-Event"), "body": json.loads(raw),
                        "signature_ok": fresh and hmac.compare_digest(
                            expected, self.headers.get("X-Modelyard-Signature", "")),
                    })
                self.send_response(503 if first else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def events(self) -> list[str]:
        """The events received, in order (retries included)."""
        with self._lock:
            return [r["event"] for r in self.received]

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
