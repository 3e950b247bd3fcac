"""Synthetic serving fleets for tests against a real Prometheus.

A Triton host (two GPUs, from the recorded fixture) serves iris v1 and v2 and a BentoML
process serves bento-iris v1, each with counters that grow at known rates. ``start_fleet``
serves both expositions, optionally writes an hour or so of their past into Prometheus's
storage with ``promtool`` (so range charts have data from the first second), and starts a
real Prometheus scraping them. ``deploy_version`` makes the registry rows of
a version that is ready on a host.
"""

import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from deployments.choices import TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from registry.choices import ArtifactFormat
from registry.models import ModelVersion, RegisteredModel
from tests.fixtures.expositions import EXPOSITIONS, ServedExposition
from tests.fixtures.services import Service, launch_prometheus, wait_for

GPU_LINES = [
    line for line in EXPOSITIONS["triton_gpu"].read_text().splitlines()
    if line.startswith(("nv_gpu_", "nv_cpu_", "# HELP nv_gpu", "# TYPE nv_gpu", "# HELP nv_cpu", "# TYPE nv_cpu"))
]
# Per second: (inferences, successes, failures, request µs, queue µs, compute µs split input/infer/output)
TRITON_RATES = {
    "1": (10, 10, 0.5, 20_000, 1_000, (500, 15_000, 500)),
    "2": (20, 20, 0.0, 30_000, 4_000, (1_000, 20_000, 1_000)),
}
QUANTILES_US = {"0.5": 1500, "0.9": 2500, "0.95": 3000, "0.99": 4000}
JOB = "serving"
TRITON_HOST_LABELS = {"host": "gpu-a"}
BENTO_HOST_LABELS = {"host": "bento-a", "model": "bento-iris", "version": "1"}
SAMPLE_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)$")


def triton_text(started: float, at: float | None = None) -> str:
    """A Triton exposition as scraped at ``at`` (unix seconds, default now) from a server up since ``started``.

    Counters for iris v1 and v2 grow at ``TRITON_RATES`` per second; the GPU and CPU gauges are the
    recorded fixture's; two pending requests per version; the latency summary quantiles are fixed.
    """
    t = (time.time() if at is None else at) - started
    lines = list(GPU_LINES)
    for name in ("count", "request_success", "request_failure", "request_duration_us", "queue_duration_us",
                 "compute_input_duration_us", "compute_infer_duration_us", "compute_output_duration_us"):
        lines.append(f"# TYPE nv_inference_{name} counter")
        for version, (inf, ok, bad, req_us, queue_us, compute) in TRITON_RATES.items():
            value = {"count": inf, "request_success": ok, "request_failure": bad, "request_duration_us": req_us,
                     "queue_duration_us": queue_us, "compute_input_duration_us": compute[0],
                     "compute_infer_duration_us": compute[1], "compute_output_duration_us": compute[2]}[name]
            extra = ',reason="BACKEND"' if name == "request_failure" else ""
            lines.append(f'nv_inference_{name}{{model="iris",version="{version}"{extra}}} {value * t:.3f}')
    lines.append("# TYPE nv_inference_pending_request_count gauge")
    lines += [f'nv_inference_pending_request_count{{model="iris",version="{v}"}} 2' for v in TRITON_RATES]
    lines.append("# TYPE nv_inference_request_summary_us summary")
    for version in TRITON_RATES:
        lines += [f'nv_inference_request_summary_us{{model="iris",version="{version}",quantile="{q}"}} {us}'
                  for q, us in QUANTILES_US.items()]
    return "\n".join(lines) + "\n"


def bentoml_text(started: float, at: float | None = None) -> str:
    """A BentoML 1.4 exposition as scraped at ``at`` (unix seconds, default now) from a process up since
    ``started``: /classify at 4.5 ok + 0.5 5xx per second (4 ms each), /readyz probes at 2/s."""
    t = (time.time() if at is None else at) - started
    common = 'runner_name="IrisClassifier",service_name="IrisClassifier",service_version="not available"'
    rows = [("/classify", "200", 4.5, 0.004), ("/classify", "500", 0.5, 0.004), ("/readyz", "200", 2.0, 0.5)]
    lines = ["# TYPE bentoml_service_request counter", "# TYPE bentoml_service_request_duration_seconds histogram"]
    for endpoint, code, rate, seconds in rows:
        labels = f'endpoint="{endpoint}",http_response_code="{code}",{common}'
        n = rate * t
        lines.append(f"bentoml_service_request_total{{{labels}}} {n:.3f}")
        for le in ("0.005", "0.01", "0.1", "1.0", "+Inf"):
            inside = n if le == "+Inf" or seconds <= float(le) else 0
            lines.append(f'bentoml_service_request_duration_seconds_bucket{{{labels},le="{le}"}} {inside:.3f}')
        lines.append(f"bentoml_service_request_duration_seconds_sum{{{labels}}} {n * seconds:.4f}")
        lines.append(f"bentoml_service_request_duration_seconds_count{{{labels}}} {n:.3f}")
    lines.append("# TYPE bentoml_service_request_in_progress gauge")
    lines.append(f'bentoml_service_request_in_progress{{endpoint="/classify",{common}}} 1')
    lines.append(f'bentoml_service_request_in_progress{{endpoint="/readyz",{common}}} 5')
    return "\n".join(lines) + "\n"


def deploy_version(model_name: str, version: int, host: ServingHost, footprint: dict | None = None,
                   artifact_format: str = ArtifactFormat.TRITON_MODEL_DIR) -> Deployment:
    """Register ``model_name`` (if new) and its ``version``, and record it as ready on ``host``.

    ``footprint`` is the measured memory growth at load, ``{"gpu": bytes, "cpu": bytes}``;
    ``artifact_format`` the version's format (a Triton model directory unless given).
    Returns the deployment; not idempotent (a second call for the same version fails).
    """
    model, _ = RegisteredModel.objects.get_or_create(name=model_name)
    mv = ModelVersion.objects.create(
        model=model, version=version, format=artifact_format, artifact_key=f"k{version}",
        artifact_sha256=f"{version:064d}", artifact_size=1,
    )
    deployment = Deployment.objects.create(model=model, version=mv)
    DeploymentTarget.objects.create(deployment=deployment, host=host, state=TargetState.READY,
                                    details={"footprint_bytes": footprint or {}})
    return deployment


@dataclass
class Fleet:
    """The served expositions and the Prometheus scraping them (``prometheus.url`` is its API)."""

    prometheus: Service
    triton: ServedExposition
    bento: ServedExposition

    def stop(self) -> None:
        """Stop Prometheus and both expositions."""
        self.prometheus.stop()
        self.triton.stop()
        self.bento.stop()


def _series_history(text_at, labels: dict[str, str], times: list[float]) -> dict:
    """Sample ``text_at(t)`` at each of ``times`` and return ``{metric name: {label text: [(t, value)]}}``
    with ``labels`` added to every series."""
    extra = ",".join(f'{k}="{v}"' for k, v in labels.items())
    history: dict[str, dict[str, list]] = {}
    for t in times:
        for line in text_at(t).splitlines():
            match = SAMPLE_LINE.match(line)
            if not match:
                continue  # comments and blank lines
            own = match.group("labels")
            label_text = f"{own},{extra}" if own else extra
            history.setdefault(match.group("name"), {}).setdefault(label_text, []).append((t, match.group("value")))
    return history


def write_history(tsdb: Path, sources: list[tuple], *, seconds: float, end: float, step: float) -> None:
    """Write the past of scraped expositions into the Prometheus storage at ``tsdb`` with ``promtool``.

    ``sources`` holds ``(text_at, labels)``: a callable returning the exposition at a unix time and
    the labels a scrape adds (job, instance, target labels), so the past continues the live series.
    Samples run every ``step`` seconds (the scrape interval that follows: rate() reads a change of
    spacing as a change of rate) over the ``seconds`` up to ``end`` (unix seconds), ``end`` included.

    Raises:
        subprocess.CalledProcessError: promtool refused the data.
    """
    times = [end - k * step for k in range(int(seconds // step), -1, -1)]
    lines = []
    for text_at, labels in sources:
        for name, series in _series_history(text_at, labels, times).items():
            # No TYPE lines: OpenMetrics would insist on _total names for Triton's counters, and
            # the storage keeps no types anyway.
            for label_text, points in series.items():
                lines += [f"{name}{{{label_text}}} {value} {t:.3f}" for t, value in points]
    history = tsdb.parent / f"{tsdb.name}-history.om"
    history.write_text("\n".join(lines) + "\n# EOF\n")
    promtool = shutil.which("promtool") or "promtool"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(history), str(tsdb)],
                   check=True, capture_output=True, timeout=120)


def _latest_sample_times(prometheus_url: str) -> dict[str, float]:
    """Unix time of the newest sample of each target's main counter, by instance."""
    query = "max by (instance) (timestamp(nv_inference_count or bentoml_service_request_total))"
    answer = requests.get(f"{prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
    answer.raise_for_status()
    return {row["metric"]["instance"]: float(row["value"][1]) for row in answer.json()["data"]["result"]}


# Prometheus scrapes first about 5-10 s after it starts. The history runs that far ahead, so the
# stored series meet the live ones within one scrape interval, without a gap that rate() would read
# as a dip in traffic; the scrapes until then fall before the stored data and are dropped.
HISTORY_LEAD_SECONDS = 10


def start_fleet(workdir: Path, *, started: float, history_seconds: int = 0, scrape_seconds: int = 1) -> Fleet:
    """Serve the Triton and BentoML expositions and start a Prometheus scraping both.

    Args:
        workdir: an empty directory for the config, storage and log.
        started: unix time the servers came up; counters are their rates times the time since.
        history_seconds: when > 0, Prometheus also holds that many seconds of past samples, one
            per scrape interval, continuous with what it scrapes.
        scrape_seconds: the scrape interval.

    Returns:
        The running fleet; call ``stop()``. Without history, once Prometheus is ready (it may not
        have scraped yet); with history, once it holds live samples of both targets after it.
    """
    triton = ServedExposition(lambda: triton_text(started))
    bento = ServedExposition(lambda: bentoml_text(started))
    config = {
        "global": {"scrape_interval": f"{scrape_seconds}s"},
        "scrape_configs": [{"job_name": JOB, "static_configs": [
            {"targets": [triton.target], "labels": TRITON_HOST_LABELS},
            {"targets": [bento.target], "labels": BENTO_HOST_LABELS},
        ]}],
    }
    tsdb = workdir / "tsdb"
    tsdb.mkdir()
    history_end = time.time() + HISTORY_LEAD_SECONDS
    if history_seconds > 0:
        write_history(tsdb, [
            (lambda t: triton_text(started, t), {"job": JOB, "instance": triton.target, **TRITON_HOST_LABELS}),
            (lambda t: bentoml_text(started, t), {"job": JOB, "instance": bento.target, **BENTO_HOST_LABELS}),
        ], seconds=history_seconds, end=history_end, step=scrape_seconds)
    try:
        service = launch_prometheus(config, workdir, tsdb)
    except BaseException:
        triton.stop()
        bento.stop()
        raise
    fleet = Fleet(prometheus=service, triton=triton, bento=bento)
    try:
        if history_seconds > 0:
            wait_for(lambda: sorted(_latest_sample_times(service.url).values())[0] > history_end, timeout=40,
                     what="Prometheus to scrape both targets after their history", interval=0.25)
    except BaseException:
        fleet.stop()
        raise
    return fleet
