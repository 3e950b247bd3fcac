"""Benchmark: render time of the fleet overview page (``GET /monitoring/``) with 200 deployed models.

What it builds, all real and on free ports or a dedicated database:

1. Two hours of recorded metrics (15 s resolution, plus ``--ahead`` minutes past now so the data is
   still current while the benchmark runs) for a fleet of Triton hosts with 2 GPUs each, written as
   OpenMetrics with Triton 2.51's metric names and labels (see tests/fixtures/data/README.md) and
   the labels Prometheus attaches (``job``, ``instance``, and ``host``/``runtime`` from the
   product's service discovery). Counters start from what they had counted since the server
   started, grow with the traffic, and reset where a host restarts; canary versions appear part way
   through; summary quantiles go NaN when a model sees no request for a minute.
2. ``promtool tsdb create-blocks-from openmetrics`` backfills it into a TSDB, and a real Prometheus
   (``--storage.tsdb.retention.time=30d``) serves it.
3. A dedicated PostgreSQL database ``modelyard_bench`` (dropped and created, ``manage.py migrate``)
   holds the same fleet: RegisteredModel, ModelVersion, ServingHost, Deployment and
   DeploymentTarget (state ready) rows.
4. The page is rendered through Django's test client (``force_login``) ``--warmup`` times, then
   timed ``--renders`` times: p50/p95/max in ms, SQL queries per render, and Prometheus HTTP
   queries per render counted by Prometheus itself (``prometheus_http_requests_total``).
   Baseline of the same run: the exact queries one render sent (recorded from the page, start and
   end of range queries moved to now), replayed directly with ``requests``.

The verdict (p50 under ``--target-ms``) is written to the results; nothing here asserts it.

Usage::

    python bench/overview.py --json bench/results/overview.json --markdown bench/results/overview.md
"""

import argparse
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import requests

REPO = Path(__file__).resolve().parents[1]
PAGE_URL = "/monitoring/"
BENCH_DATABASE = "modelyard_bench"
STEP_S = 15
HISTORY_S = 2 * 3600
GPUS_PER_HOST = 2
GPU_MEMORY_TOTAL = 85_899_345_920  # an 80 GB card as DCGM reports it: 81920 MiB
GPU_POWER_LIMIT_W = 400.0
CPU_MEMORY_TOTAL = 540_573_614_080
PINNED_POOL_BYTES = 268_435_456
QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")
# Multiples of the mean latency a request-latency distribution with a long tail has at each quantile.
QUANTILE_FACTORS = (0.82, 1.55, 1.9, 2.9, 4.4)
FAILURE_REASONS = ("BACKEND", "CANCELED", "OTHER", "REJECTED")
SUMMARY_WINDOW_SAMPLES = 4  # Triton's summaries age out observations after 60 s
MIB = 1024**2
FAMILIES = (
    "resnet50", "bert-base", "yolov8", "whisper-small", "clip-vit", "fraud-xgb", "ranker", "embedder",
    "ocr", "ner", "sentiment", "churn", "segformer", "t5-small", "detr", "asr-conformer",
)
TEAMS = ("search", "ads", "risk", "vision", "speech", "growth", "core", "maps")


def log(message: str) -> None:
    print(f"[overview] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- the fleet


@dataclass
class Host:
    """A Triton host: its name, GPUs, seconds since its server started (at the window's start), restart."""

    name: str
    gpus: list[str]
    uptime_s: float
    restart_index: int | None = None  # sample index where the server restarted (counters reset)


@dataclass
class Served:
    """One model version served on one host, with its traffic shape.

    ``rate`` in requests/s, ``latency_ms`` the mean request latency, ``start_index`` the first
    sample (later than 0 for a version loaded during the window).
    """

    model: str
    version: int
    host: Host
    rate: float
    batch: float
    dyn_batch: float
    latency_ms: float
    queue_frac: float
    fail_frac: float
    rejects: bool
    memory_gib: float
    phase: float
    start_index: int = 0


@dataclass
class Fleet:
    """Hosts, models (name -> versions) and where each version is served."""

    hosts: list[Host]
    models: dict[str, list[int]]
    served: list[Served] = field(default_factory=list)

    def placements(self) -> dict[tuple[str, int], list[str]]:
        """(model, version) -> host names, in host order."""
        out: dict[tuple[str, int], list[str]] = {}
        for s in self.served:
            out.setdefault((s.model, s.version), []).append(s.host.name)
        return out


def plan_fleet(rng: np.random.Generator, *, models: int, hosts: int, samples: int) -> Fleet:
    """Choose hosts, models, versions and placements.

    Each model is served on 1–3 hosts. About 40 % of models have two versions: version N-1 on
    all but one of its hosts and version N, with 15 % of the traffic, on the last one (a canary),
    a third of those loaded during the window.
    A host serves at most one version of a model, as the registry's deployments do.
    """
    host_list = [
        Host(
            name=f"gpu-{i:03d}",
            gpus=[f"GPU-{uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | i << 8 | g)}" for g in range(GPUS_PER_HOST)],
            uptime_s=float(rng.uniform(3 * 3600, 21 * 86400)),
        )
        for i in range(hosts)
    ]
    for host in rng.choice(host_list, size=max(1, hosts // 16), replace=False):
        host.restart_index = int(rng.integers(samples // 6, samples * 2 // 3))
    fleet = Fleet(hosts=host_list, models={})
    for i in range(models):
        name = f"{FAMILIES[i % len(FAMILIES)]}-{TEAMS[(i // len(FAMILIES)) % len(TEAMS)]}-{i:03d}"
        two_versions = rng.random() < 0.4
        latest = int(rng.integers(2, 9)) if two_versions else int(rng.integers(1, 6))
        versions = [latest - 1, latest] if two_versions else [latest]
        fleet.models[name] = versions
        idle = rng.random() < 0.04
        model_rate = float(np.exp(rng.uniform(np.log(0.3), np.log(250)))) if not idle else 0.004
        latency = float(np.exp(rng.uniform(np.log(0.8), np.log(120))))
        batch = float(rng.choice([1, 1, 1, 2, 4, 8]))
        dyn_batch = float(rng.choice([1.0, 1.0, 1.6, 3.0]))
        fail = float(rng.choice([0.0, 0.0, 0.0, 0.0005, 0.004, 0.03]))
        rejects = bool(rng.random() < 0.05)
        memory = float(rng.uniform(0.3, 6.0))
        host_count = max(int(rng.integers(1, 4)), 2 if two_versions else 1)
        placed = list(rng.choice(host_list, size=host_count, replace=False))
        stable_hosts = host_count - 1 if two_versions else host_count
        canary_start = int(rng.integers(samples // 10, samples // 2)) if two_versions and rng.random() < 1 / 3 else 0
        for index, host in enumerate(placed):
            version = versions[-1] if two_versions and index == len(placed) - 1 else versions[0]
            canary = two_versions and version == versions[-1]
            share = 0.15 if canary else (0.85 if two_versions else 1.0) / stable_hosts
            fleet.served.append(Served(
                model=name, version=version, host=host,
                rate=model_rate * share, batch=batch, dyn_batch=dyn_batch,
                latency_ms=latency * (0.93 if canary else 1.0), queue_frac=float(rng.uniform(0.02, 0.2)),
                fail_frac=fail, rejects=rejects, memory_gib=memory, phase=float(rng.uniform(0, 2 * np.pi)),
                start_index=canary_start if canary else 0,
            ))
    return fleet


# --------------------------------------------------------------------------- OpenMetrics


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _target_labels(host: Host) -> dict[str, str]:
    return {"host": host.name, "instance": f"{host.name}:8002", "job": "triton", "runtime": "triton"}


def _fmt_int(values: np.ndarray) -> list[str]:
    return [str(v) for v in values.astype(np.int64).tolist()]


def _fmt_float(values: np.ndarray, digits: int = 6) -> list[str]:
    return ["NaN" if math.isnan(v) else repr(round(v, digits)) for v in values.tolist()]


class SeriesWriter:
    """Writes OpenMetrics families, each series contiguous and in timestamp order."""

    def __init__(self, path: Path, timestamps: np.ndarray):
        self.file = path.open("w", buffering=8 * MIB)
        self.ts = [str(t) for t in timestamps.tolist()]
        self.lines = 0

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.file.write(f"# TYPE {name} {kind}\n# HELP {name} {help_text}\n")

    def series(self, name: str, labels: str, values: list[str], index: np.ndarray) -> None:
        prefix = name + labels + " "
        ts = self.ts
        self.file.write("".join([f"{prefix}{v} {ts[i]}\n" for v, i in zip(values, index.tolist(), strict=True)]))
        self.lines += len(values)

    def summary(self, name: str, labels: dict, quantiles: list[list[str]], total: list[str], count: list[str],
                index: np.ndarray) -> None:
        """One summary's MetricPoints: per timestamp its quantiles, ``_sum`` and ``_count``."""
        q_prefixes = [f"{name}{_labels(**labels, quantile=q)} " for q in QUANTILES]
        sum_prefix, count_prefix = f"{name}_sum{_labels(**labels)} ", f"{name}_count{_labels(**labels)} "
        out = []
        for j, i in enumerate(index.tolist()):
            t = self.ts[i]
            out.extend(f"{p}{quantiles[k][j]} {t}\n" for k, p in enumerate(q_prefixes))
            out.append(f"{sum_prefix}{total[j]} {t}\n")
            out.append(f"{count_prefix}{count[j]} {t}\n")
        self.file.write("".join(out))
        self.lines += len(out)

    def close(self) -> None:
        self.file.write("# EOF\n")
        self.file.close()


def _cumulative(increments: np.ndarray, initial: float, reset_at: int | None) -> np.ndarray:
    """Counter values from per-step increments, restarting from zero at ``reset_at``."""
    values = initial + np.cumsum(increments)
    if reset_at is not None:
        values[reset_at:] = np.cumsum(increments[reset_at:])
    return values


def _present(n: int, start: int, reset_at: int | None) -> np.ndarray:
    """Sample indices a series has: from ``start``, minus two missed scrapes while its host restarts."""
    mask = np.zeros(n, dtype=bool)
    mask[start:] = True
    if reset_at is not None:
        mask[max(0, reset_at - 2):reset_at] = False
    return np.flatnonzero(mask)


def write_openmetrics(fleet: Fleet, path: Path, timestamps: np.ndarray, rng: np.random.Generator) -> dict:
    """Write the fleet's Triton series to ``path``; return counts of series and samples."""
    n = len(timestamps)
    t = timestamps.astype(float)
    served = []
    for s in fleet.served:
        # Traffic: a slow daily swing, a half-hour wave and noise, in requests per step.
        load = (1 + 0.25 * np.sin(2 * np.pi * t / 86400 + s.phase) + 0.12 * np.sin(2 * np.pi * t / 1800 + s.phase)
                ) * rng.lognormal(0, 0.12, n)
        requests_ = rng.poisson(np.maximum(s.rate * load * STEP_S, 0))
        failed = rng.binomial(requests_, s.fail_frac) if s.fail_frac else np.zeros(n, dtype=np.int64)
        ok = requests_ - failed
        rejected = np.zeros(n, dtype=np.int64)
        if s.rejects:  # a queue-policy model that sheds load during peaks
            rejected = rng.binomial(requests_, np.clip((load - 1.15) * 0.2, 0, 0.2))
            ok = ok - np.minimum(rejected, ok)
        latency_us = s.latency_ms * 1000 * (1 + 0.3 * (load - 1)) * rng.lognormal(0, 0.08, n)
        restart = s.host.restart_index
        reset = restart if restart is not None and restart > s.start_index else None
        uptime = s.host.uptime_s if s.start_index == 0 else 0.0
        initial_requests = s.rate * uptime
        index = _present(n, s.start_index, reset)
        if s.start_index:
            ok[: s.start_index + 1] = 0
            failed[: s.start_index + 1] = 0
            rejected[: s.start_index + 1] = 0
        duration = ok * latency_us
        queue = duration * s.queue_frac * rng.lognormal(0, 0.1, n)
        compute = duration - queue
        served.append({
            "s": s, "index": index, "ok": ok, "latency_us": latency_us, "load": load,
            "success": _cumulative(ok, initial_requests, reset),
            "failure": {
                "BACKEND": _cumulative(failed, initial_requests * s.fail_frac, reset),
                "CANCELED": np.zeros(n), "OTHER": np.zeros(n),
                "REJECTED": _cumulative(rejected, initial_requests * 0.01 if s.rejects else 0, reset),
            },
            "count": _cumulative(np.round(ok * s.batch * rng.uniform(0.9, 1.1, n)), initial_requests * s.batch, reset),
            "exec": _cumulative(np.ceil(ok / s.dyn_batch), initial_requests / s.dyn_batch, reset),
            "request_duration": _cumulative(np.round(duration), initial_requests * s.latency_ms * 1000, reset),
            "queue_duration": _cumulative(np.round(queue), initial_requests * s.latency_ms * 1000 * s.queue_frac,
                                          reset),
            "compute_input": _cumulative(np.round(compute * 0.04), initial_requests * s.latency_ms * 40, reset),
            "compute_infer": _cumulative(np.round(compute * 0.9), initial_requests * s.latency_ms * 900, reset),
            "compute_output": _cumulative(np.round(compute * 0.06), initial_requests * s.latency_ms * 60, reset),
            # Little's law: requests waiting = arrival rate x time spent in the queue.
            "pending": rng.poisson(np.maximum(s.rate * load * latency_us / 1e6 * s.queue_frac, 0)),
        })

    writer = SeriesWriter(path, timestamps)
    counters = (
        ("nv_inference_request_success", "success", "Number of successful inference requests, all batch sizes"),
        ("nv_inference_count", "count", "Number of inferences performed (does not include cached requests)"),
        ("nv_inference_exec_count", "exec", "Number of model executions performed (does not include cached requests)"),
        ("nv_inference_request_duration_us", "request_duration",
         "Cumulative inference request duration in microseconds (includes cached requests)"),
        ("nv_inference_queue_duration_us", "queue_duration",
         "Cumulative inference queuing duration in microseconds (includes cached requests)"),
        ("nv_inference_compute_input_duration_us", "compute_input",
         "Cumulative compute input duration in microseconds (does not include cached requests)"),
        ("nv_inference_compute_infer_duration_us", "compute_infer",
         "Cumulative compute inference duration in microseconds (does not include cached requests)"),
        ("nv_inference_compute_output_duration_us", "compute_output",
         "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    )
    series_count = 0
    # OpenMetrics requires the _total suffix on counter samples; Triton's counters have none, so
    # they are declared "unknown": the names stay Triton's and Prometheus stores them the same.
    for name, key, help_text in counters[:1]:
        writer.family(name, "unknown", help_text)
        for d in served:
            writer.series(name, _labels(**_target_labels(d["s"].host), model=d["s"].model, version=str(d["s"].version)),
                          _fmt_int(d[key][d["index"]]), d["index"])
            series_count += 1
    writer.family("nv_inference_request_failure", "unknown", "Number of failed inference requests, all batch sizes")
    for d in served:
        for reason in FAILURE_REASONS:
            labels = _labels(**_target_labels(d["s"].host), model=d["s"].model, reason=reason,
                             version=str(d["s"].version))
            values = _fmt_int(d["failure"][reason][d["index"]])
            writer.series("nv_inference_request_failure", labels, values, d["index"])
            series_count += 1
    for name, key, help_text in counters[1:]:
        writer.family(name, "unknown", help_text)
        for d in served:
            writer.series(name, _labels(**_target_labels(d["s"].host), model=d["s"].model, version=str(d["s"].version)),
                          _fmt_int(d[key][d["index"]]), d["index"])
            series_count += 1

    series_count += _write_host_series(writer, fleet, served, timestamps, rng)

    writer.family("nv_inference_pending_request_count", "gauge",
                  "Instantaneous number of pending requests awaiting execution per-model.")
    for d in served:
        writer.series("nv_inference_pending_request_count",
                      _labels(**_target_labels(d["s"].host), model=d["s"].model, version=str(d["s"].version)),
                      _fmt_int(d["pending"][d["index"]]), d["index"])
        series_count += 1

    writer.family("nv_inference_request_summary_us", "summary",
                  "Summary of inference request duration in microseconds (includes cached requests)")
    for d in served:
        idx = d["index"]
        # Quantiles over Triton's sliding window: NaN once no request arrived for a minute.
        recent = np.convolve(d["ok"], np.ones(SUMMARY_WINDOW_SAMPLES), mode="full")[: n]
        spread = rng.lognormal(0, 0.06, (len(QUANTILES), n))
        quantiles = []
        for k, factor in enumerate(QUANTILE_FACTORS):
            q = np.round(d["latency_us"] * factor * spread[k])
            q = np.where(recent > 0, q, np.nan)
            quantiles.append(q)
        for k in range(1, len(quantiles)):  # keep them ordered, as quantiles of one window are
            quantiles[k] = np.fmax(quantiles[k], quantiles[k - 1])
        writer.summary("nv_inference_request_summary_us",
                       {**_target_labels(d["s"].host), "model": d["s"].model, "version": str(d["s"].version)},
                       [_fmt_float(q[idx], 0) for q in quantiles],
                       _fmt_int(d["request_duration"][idx]), _fmt_int(d["success"][idx]), idx)
        series_count += len(QUANTILES) + 2
    writer.close()
    return {"series": series_count, "samples": writer.lines}


def _write_host_series(writer: SeriesWriter, fleet: Fleet, served: list[dict], timestamps: np.ndarray,
                       rng: np.random.Generator) -> int:
    """Per-GPU and per-host series: energy (a counter), pinned memory, GPU and CPU gauges."""
    n = len(timestamps)
    by_host: dict[str, list[dict]] = {}
    for d in served:
        by_host.setdefault(d["s"].host.name, []).append(d)
    gpu: dict[str, dict[str, dict]] = {}
    cpu: dict[str, dict] = {}
    for host in fleet.hosts:
        rows = by_host.get(host.name, [])
        # Busy GPU-seconds per second, split over the GPUs (one model instance per GPU).
        busy = sum((r["ok"] / STEP_S * r["latency_us"] / 1e6 * 0.9 for r in rows), np.zeros(n)) / GPUS_PER_HOST
        gpu[host.name] = {}
        for g, gpu_uuid in enumerate(host.gpus):
            utilization = np.clip(0.02 + busy * rng.uniform(0.8, 1.2) + rng.normal(0, 0.02, n), 0, 0.99)
            used_mib = 512 + sum(r["s"].memory_gib * 1024 for r in rows) + rng.integers(0, 64) * 16 + g * 96
            used = np.full(n, int(used_mib) * MIB, dtype=np.int64)
            power = 62 + utilization * (GPU_POWER_LIMIT_W - 90) + rng.normal(0, 3, n)
            energy = _cumulative(power * STEP_S, host.uptime_s * 150.0, host.restart_index)
            gpu[host.name][gpu_uuid] = {"utilization": utilization, "used": used, "power": power, "energy": energy}
        cpu[host.name] = {
            "utilization": np.clip(0.04 + busy * 0.15 + rng.normal(0, 0.01, n), 0, 1),
            "used": (rng.uniform(35, 90) * 1024**3 + np.cumsum(rng.normal(0, 2 * MIB, n))).astype(np.int64),
        }
    count = 0

    def per_gpu(name: str, kind: str, help_text: str, key: str, fmt) -> None:
        nonlocal count
        writer.family(name, kind, help_text)
        for host in fleet.hosts:
            index = _present(n, 0, host.restart_index)
            for gpu_uuid, values in gpu[host.name].items():
                writer.series(name, _labels(**_target_labels(host), gpu_uuid=gpu_uuid), fmt(values[key][index]), index)
                count += 1

    def per_host(name: str, help_text: str, values_of) -> None:
        nonlocal count
        writer.family(name, "gauge", help_text)
        for host in fleet.hosts:
            index = _present(n, 0, host.restart_index)
            writer.series(name, _labels(**_target_labels(host)), values_of(host)[index].tolist(), index)
            count += 1

    per_gpu("nv_energy_consumption", "unknown", "GPU energy consumption in joules since the Triton Server started",
            "energy", lambda v: _fmt_float(v, 3))
    per_host("nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes",
             lambda h: np.array([str(PINNED_POOL_BYTES)] * n))
    per_host("nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes",
             lambda h: np.array(["0"] * n))
    per_gpu("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", "utilization",
            lambda v: _fmt_float(v, 2))
    writer.family("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes")
    for host in fleet.hosts:
        index = _present(n, 0, host.restart_index)
        for gpu_uuid in host.gpus:
            writer.series("nv_gpu_memory_total_bytes", _labels(**_target_labels(host), gpu_uuid=gpu_uuid),
                          [str(GPU_MEMORY_TOTAL)] * len(index), index)
            count += 1
    per_gpu("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", "used", _fmt_int)
    per_gpu("nv_gpu_power_usage", "gauge", "GPU power usage in watts", "power", lambda v: _fmt_float(v, 3))
    writer.family("nv_gpu_power_limit", "gauge", "GPU power management limit in watts")
    for host in fleet.hosts:
        index = _present(n, 0, host.restart_index)
        for gpu_uuid in host.gpus:
            writer.series("nv_gpu_power_limit", _labels(**_target_labels(host), gpu_uuid=gpu_uuid),
                          [repr(GPU_POWER_LIMIT_W)] * len(index), index)
            count += 1
    per_host("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]",
             lambda h: np.array(_fmt_float(cpu[h.name]["utilization"], 4)))
    per_host("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes",
             lambda h: np.array([str(CPU_MEMORY_TOTAL)] * n))
    per_host("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes",
             lambda h: np.array(_fmt_int(cpu[h.name]["used"])))
    return count


# --------------------------------------------------------------------------- Prometheus


def backfill(openmetrics: Path, tsdb: Path) -> float:
    """Import the OpenMetrics file into TSDB blocks with promtool; return the seconds it took."""
    started = time.perf_counter()
    result = subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(tsdb)],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"promtool failed ({result.returncode}): {result.stderr[-2000:]}")
    return time.perf_counter() - started


class Prometheus:
    """A real Prometheus serving a backfilled TSDB, with no scrape jobs (nothing is appended)."""

    def __init__(self, tsdb: Path, workdir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = workdir / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\nscrape_configs: []\n")
        self.log_path = workdir / "prometheus.log"
        with self.log_path.open("wb") as log_file:
            self.process = subprocess.Popen(
                ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
                 "--storage.tsdb.retention.time=30d", f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            )

    def query(self, promql: str) -> list:
        answer = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=30)
        answer.raise_for_status()
        return answer.json()["data"]["result"]

    def wait_for_data(self, expected_series: int, timeout: float = 120) -> float:
        """Wait until every ``nv_inference_count`` series answers at the current time; return the seconds waited."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"Prometheus exited: {self.log_path.read_text()[-2000:]}")
            try:
                result = self.query("count(nv_inference_count)")
                if result and int(float(result[0]["value"][1])) >= expected_series:
                    return time.monotonic() - started
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"Prometheus did not answer with data within {timeout} s")

    def request_counts(self) -> dict[str, float]:
        """``prometheus_http_requests_total`` per handler, summed over status codes, from its own /metrics."""
        from prometheus_client.parser import text_string_to_metric_families

        text = requests.get(f"{self.url}/metrics", timeout=10).text
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "prometheus_http_requests":
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        handler = sample.labels.get("handler", "")
                        counts[handler] = counts.get(handler, 0.0) + sample.value
        return counts

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


# --------------------------------------------------------------------------- database


def _admin_connection():
    import psycopg

    return psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True)


def recreate_database() -> None:
    with _admin_connection() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DATABASE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DATABASE}")


def drop_database() -> None:
    with _admin_connection() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DATABASE} WITH (FORCE)")


def migrate(env: dict) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=REPO, env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"manage.py migrate failed: {result.stdout[-1000:]}{result.stderr[-2000:]}")
    return time.perf_counter() - started


def populate(fleet: Fleet) -> dict:
    """Create the fleet's rows with the ORM: models, versions, hosts, deployments, ready targets."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from accounts.choices import Role
    from accounts.services import default_team, set_membership
    from deployments.choices import TargetState
    from deployments.models import Deployment, DeploymentTarget, ServingHost
    from registry.choices import ArtifactFormat
    from registry.models import ModelVersion, RegisteredModel

    placements = fleet.placements()
    with transaction.atomic():
        user = get_user_model().objects.create_user(username="bench", password=uuid.uuid4().hex)
        # an owner of the team the models go to, as a user of the product would be (not an administrator,
        # whose lists skip the team filter)
        set_membership(team=default_team(), user=user, role=Role.OWNER)
        hosts = {
            h.name: h for h in ServingHost.objects.bulk_create([
                ServingHost(name=h.name, inference_url=f"http://{h.name}:8000", metrics_url=f"http://{h.name}:8002/metrics",
                            labels={"gpus": str(len(h.gpus))})
                for h in fleet.hosts
            ])
        }
        models = {
            m.name: m for m in RegisteredModel.objects.bulk_create([
                RegisteredModel(name=name, description=f"{name} serving model", tags={"team": name.split("-")[-2]},
                                next_version=max(versions) + 1, created_by=user)
                for name, versions in fleet.models.items()
            ])
        }
        version_rows = []
        for name, versions in fleet.models.items():
            for number in versions:
                digest = uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{number}").hex * 2
                version_rows.append(ModelVersion(
                    model=models[name], version=number, format=ArtifactFormat.TRITON_MODEL_DIR,
                    artifact_key=f"artifacts/sha256/{digest[:2]}/{digest}.tar.gz", artifact_sha256=digest,
                    artifact_size=50_000_000, artifact_filename=f"{name}-{number}.tar.gz", created_by=user,
                ))
        versions = {(v.model.name, v.version): v for v in ModelVersion.objects.bulk_create(version_rows)}
        deployments = Deployment.objects.bulk_create([
            Deployment(model=models[name], version=versions[(name, number)], created_by=user)
            for (name, number) in placements
        ])
        targets = DeploymentTarget.objects.bulk_create([
            DeploymentTarget(deployment=deployment, host=hosts[host_name], state=TargetState.READY)
            for deployment, host_names in zip(deployments, placements.values(), strict=True)
            for host_name in host_names
        ])
    return {"models": len(models), "versions": len(versions), "hosts": len(hosts),
            "deployments": len(deployments), "targets": len(targets), "user_id": user.pk}


# --------------------------------------------------------------------------- measurement


class PrometheusRecorder:
    """Records (and times) every HTTP request the app sends to Prometheus while active.

    The page sends its queries concurrently, so the time it waited is the union of the
    requests' intervals (wall clock), not their sum.
    """

    def __init__(self, prometheus_url: str):
        self.prefix = prometheus_url
        self.calls: list[dict] = []
        self.intervals: list[tuple[float, float]] = []
        self._original = None

    @property
    def wait_s(self) -> float:
        """Seconds during which at least one request to Prometheus was in flight."""
        total, end = 0.0, float("-inf")
        for start, stop in sorted(self.intervals):
            if stop > end:
                total += stop - max(start, end)
                end = stop
        return total

    def __enter__(self):
        original = requests.Session.request
        recorder = self

        def request(session, method, url, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(session, method, url, *args, **kwargs)
            finally:
                if str(url).startswith(recorder.prefix):
                    recorder.intervals.append((started, time.perf_counter()))
                    params = dict(kwargs.get("params") or {})
                    recorder.calls.append({"method": method, "url": str(url), "params": params})

        self._original = original
        requests.Session.request = request
        return self

    def __exit__(self, *exc):
        requests.Session.request = self._original


def replay(calls: list[dict]) -> tuple[float, list[float]]:
    """Send the recorded queries again, in order, on one new session.

    Range queries keep their length and step, ending now.

    Returns:
        The seconds all of them took, and the seconds of each.
    """
    now = time.time()
    each = []
    started = time.perf_counter()
    with requests.Session() as session:
        for call in calls:
            params = dict(call["params"])
            if "start" in params and "end" in params:
                length = float(params["end"]) - float(params["start"])
                params["end"], params["start"] = now, now - length
            sent = time.perf_counter()
            answer = session.request(call["method"], call["url"], params=params, timeout=30)
            answer.raise_for_status()
            each.append(time.perf_counter() - sent)
    return time.perf_counter() - started, each


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def stats_ms(seconds: list[float]) -> dict:
    ms = [s * 1000 for s in seconds]
    return {"p50_ms": round(percentile(ms, 50), 2), "p95_ms": round(percentile(ms, 95), 2),
            "max_ms": round(max(ms), 2), "min_ms": round(min(ms), 2), "mean_ms": round(statistics.fmean(ms), 2)}


def page_available() -> bool:
    views = REPO / "monitoring" / "views.py"
    return views.exists() and "def overview(" in views.read_text()


def measure(prometheus: Prometheus, user_id: int, *, warmup: int, renders: int) -> dict:
    """Time the page and the raw-query baseline; see the module docstring.

    Each round renders the page, then replays the queries one render sent, so both see the same
    load on the machine. Prometheus's request counters are read around the render alone.
    """
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(get_user_model().objects.get(pk=user_id))

    def render():
        response = client.get(PAGE_URL, secure=True)
        if response.status_code != 200:
            raise RuntimeError(f"GET {PAGE_URL} answered {response.status_code}")
        return response

    with PrometheusRecorder(prometheus.url) as recorder:
        render()
    calls = recorder.calls
    for _ in range(warmup - 1):
        render()
    for _ in range(warmup):
        replay(calls)

    load_before = os.getloadavg()
    durations, outside, sql_counts, waits, raw, raw_each = [], [], [], [], [], []
    handled: dict[str, float] = {}
    for _ in range(renders):
        before = prometheus.request_counts()
        with PrometheusRecorder(prometheus.url) as wait, CaptureQueriesContext(connection) as sql:
            started = time.perf_counter()
            response = render()
            durations.append(time.perf_counter() - started)
        after = prometheus.request_counts()
        for handler in set(after) - {"/metrics"}:
            handled[handler] = handled.get(handler, 0.0) + after[handler] - before.get(handler, 0.0)
        sql_counts.append(len(sql.captured_queries))
        waits.append(wait.wait_s)
        outside.append(durations[-1] - wait.wait_s)
        total, each = replay(calls)
        raw.append(total)
        raw_each.append(each)
    load_after = os.getloadavg()

    text = response.content.decode()
    page = stats_ms(durations)
    raw_stats = stats_ms(raw)
    per_handler = {h: round(v / renders, 2) for h, v in sorted(handled.items()) if v}
    return {
        "page": {**page, "renders": renders, "warmup": warmup, "response_bytes": len(response.content),
                 "rows_rendered": text.count('class="overview-row"'),
                 "rows_with_throughput": text.count('class="num throughput">')
                 - text.count('class="num throughput">—</td>')},
        "prometheus_queries_per_render": {
            "counted_by_prometheus": {"total": round(sum(per_handler.values()), 2), "by_handler": per_handler},
            "sent_by_the_page": len(calls),
        },
        "prometheus_wait_per_render": stats_ms(waits),
        "outside_prometheus_per_render": stats_ms(outside),
        "sql_queries_per_render": {"min": min(sql_counts), "max": max(sql_counts)},
        "raw_queries": {**raw_stats, "queries": [
            {"path": c["url"].removeprefix(prometheus.url),
             **{k: v for k, v in c["params"].items() if k in ("query", "step")},
             "p50_ms": round(percentile([e[i] * 1000 for e in raw_each], 50), 2)}
            for i, c in enumerate(calls)
        ]},
        "page_over_raw_p50": round(page["p50_ms"] / raw_stats["p50_ms"], 2) if raw_stats["p50_ms"] else None,
        "load_average_1m": {"before": round(load_before[0], 2), "after": round(load_after[0], 2)},
    }


# --------------------------------------------------------------------------- reporting


def write_results(result: dict, json_path: Path, markdown_path: Path) -> None:
    """Write both files through ``.tmp`` names, so a failed run leaves the previous results intact."""
    for path, text in ((json_path, json.dumps(result, indent=2) + "\n"), (markdown_path, markdown(result))):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


def markdown(r: dict) -> str:
    lines = [f"# Fleet overview page (`GET {PAGE_URL}`)", "", f"Run {r['finished_at']} on {r['machine']}.", ""]
    lines += [f"**Verdict: {r['verdict'].upper()}** — {r['verdict_reason']}", ""]
    f, d = r["fleet"], r["data"]
    lines += [
        "## Setup", "",
        f"- Fleet: {f['models']} models, {f['versions']} deployed versions, {f['hosts']} hosts × {GPUS_PER_HOST} GPUs, "
        f"{f['placements']} (model, version, host) placements.",
        f"- Prometheus {d['prometheus_version']}: {d['series']} series, {d['samples']} samples "
        f"({d['history_s'] // 60} min of history at {STEP_S} s, plus {d['ahead_s'] // 60} min ahead), "
        f"generated in {d['generate_s']} s ({d['openmetrics_mb']} MB OpenMetrics), backfilled in {d['backfill_s']} s.",
        f"- PostgreSQL database `{BENCH_DATABASE}`, migrated in {r['database']['migrate_s']} s.",
        "",
    ]
    m = r.get("measurement")
    if not m:
        lines += ["No page measurement: " + r["verdict_reason"], ""]
        return "\n".join(lines)
    p = m["page"]
    q = m["prometheus_queries_per_render"]
    by_handler = ", ".join(f"`{h}` {v:g}" for h, v in q["counted_by_prometheus"]["by_handler"].items())
    low, high = m["sql_queries_per_render"]["min"], m["sql_queries_per_render"]["max"]
    sql = f"{low}" if low == high else f"{low}–{high}"
    lines += [
        "## Results", "",
        "| measure | p50 | p95 | max |", "|---|---|---|---|",
        f"| page render (ms), {p['renders']} renders after {p['warmup']} warm-ups | {p['p50_ms']} | {p['p95_ms']} | "
        f"{p['max_ms']} |",
        f"| raw Prometheus queries of one render (ms) | {m['raw_queries']['p50_ms']} | {m['raw_queries']['p95_ms']} | "
        f"{m['raw_queries']['max_ms']} |",
        f"| time the page waited on Prometheus (ms) | {m['prometheus_wait_per_render']['p50_ms']} | "
        f"{m['prometheus_wait_per_render']['p95_ms']} | {m['prometheus_wait_per_render']['max_ms']} |",
        f"| the rest of the render: Django, SQL, JSON, template (ms) | "
        f"{m['outside_prometheus_per_render']['p50_ms']} | {m['outside_prometheus_per_render']['p95_ms']} | "
        f"{m['outside_prometheus_per_render']['max_ms']} |",
        "",
        "Each round renders the page, then replays the queries one render sent (same order, one HTTP session, "
        "range queries moved to end now), so both see the same load. "
        f"1-minute load average {m['load_average_1m']['before']} before, {m['load_average_1m']['after']} after.",
        "",
        f"- Page p50 / raw query p50: **{m['page_over_raw_p50']}×**.",
        f"- Prometheus HTTP queries per render (Prometheus's own `prometheus_http_requests_total`): "
        f"{q['counted_by_prometheus']['total']:g} ({by_handler}).",
        f"- SQL queries per render: {sql}.",
        f"- Rows rendered: {p['rows_rendered']} ({p['rows_with_throughput']} with a throughput value); "
        f"response {p['response_bytes']} bytes.",
        "", "## Queries the page sends", "",
    ]
    lines += ["Sent in this order; p50 of each when replayed directly.", "",
              "| # | endpoint | p50 (ms) | PromQL |", "|---|---|---|---|"]
    for number, query in enumerate(m["raw_queries"]["queries"], start=1):
        step = f" (step {query['step']})" if "step" in query else ""
        promql = query.get("query", "").replace("|", "\\|")
        lines.append(f"| {number} | `{query['path']}`{step} | {query['p50_ms']} | `{promql}` |")
    lines.append("")
    return "\n".join(lines)


def machine() -> str:
    return f"{platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def prometheus_version() -> str:
    out = subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
    return (out.stdout or out.stderr).split("\n")[0].removeprefix("prometheus, version ").split(" ")[0]


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", type=Path, default=REPO / "bench/results/overview.json")
    parser.add_argument("--markdown", type=Path, default=REPO / "bench/results/overview.md")
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--hosts", type=int, default=48)
    parser.add_argument("--renders", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--target-ms", type=float, default=300.0)
    parser.add_argument("--ahead", type=int, default=15, help="minutes of data past now (default 15)")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--wait-for-page", type=float, default=0,
                        help="seconds to wait for monitoring/views.py to define overview (default 0)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory and the database")
    args = parser.parse_args(argv)

    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            parser.error(f"{tool} is not installed (make install-prometheus)")

    workdir = Path(tempfile.mkdtemp(prefix="modelyard-bench-overview-"))
    rng = np.random.default_rng(args.seed)
    now = int(time.time()) // STEP_S * STEP_S
    timestamps = np.arange(now - HISTORY_S, now + args.ahead * 60 + 1, STEP_S, dtype=np.int64)
    result: dict = {"benchmark": "overview", "page": PAGE_URL, "target_p50_ms": args.target_ms,
                    "started_at": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine()}
    prometheus = None
    database_ready = False
    try:
        fleet = plan_fleet(rng, models=args.models, hosts=args.hosts, samples=len(timestamps))
        result["fleet"] = {"models": len(fleet.models), "versions": len(fleet.placements()), "hosts": len(fleet.hosts),
                           "placements": len(fleet.served),
                           "models_with_two_versions": sum(len(v) == 2 for v in fleet.models.values())}
        log(f"writing OpenMetrics for {len(fleet.served)} placements, {len(timestamps)} samples each")
        openmetrics = workdir / "fleet.om.txt"
        started = time.perf_counter()
        counts = write_openmetrics(fleet, openmetrics, timestamps, rng)
        generate_s = time.perf_counter() - started
        log(f"{counts['samples']} samples in {generate_s:.1f} s; backfilling")
        tsdb = workdir / "tsdb"
        backfill_s = backfill(openmetrics, tsdb)
        result["data"] = {**counts, "history_s": HISTORY_S, "ahead_s": args.ahead * 60, "step_s": STEP_S,
                          "generate_s": round(generate_s, 1), "backfill_s": round(backfill_s, 1),
                          "openmetrics_mb": round(openmetrics.stat().st_size / MIB, 1),
                          "prometheus_version": prometheus_version()}
        openmetrics.unlink()
        prometheus = Prometheus(tsdb, workdir)
        result["data"]["prometheus_ready_s"] = round(prometheus.wait_for_data(len(fleet.served)), 1)
        log(f"Prometheus on {prometheus.url} answers with data")

        env = {**os.environ, "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{BENCH_DATABASE}",
               "MODELYARD_PROMETHEUS_URL": prometheus.url, "MODELYARD_DEBUG": "false",
               "MODELYARD_SECRET_KEY": uuid.uuid4().hex * 2, "MODELYARD_LOG_LEVEL": "WARNING",
               "DJANGO_SETTINGS_MODULE": "modelyard.settings"}
        recreate_database()
        database_ready = True
        result["database"] = {"name": BENCH_DATABASE, "migrate_s": round(migrate(env), 1)}
        os.environ.update(env)
        sys.path.insert(0, str(REPO))
        import django

        django.setup()
        result["database"].update(populate(fleet))
        log(f"database: {result['database']}")

        deadline = time.monotonic() + args.wait_for_page
        while not page_available() and time.monotonic() < deadline:
            time.sleep(30)
        if not page_available():
            result["verdict"] = "not run"
            result["verdict_reason"] = "monitoring/views.py defines no overview view yet"
        else:
            if time.time() > timestamps[-1] - 300:
                raise RuntimeError("the recorded data no longer reaches now; rerun with a larger --ahead")
            log("measuring")
            result["measurement"] = measure(prometheus, result["database"]["user_id"],
                                            warmup=args.warmup, renders=args.renders)
            p50 = result["measurement"]["page"]["p50_ms"]
            passed = p50 < args.target_ms
            result["verdict"] = "pass" if passed else "fail"
            result["verdict_reason"] = (f"p50 {p50} ms is {'under' if passed else 'not under'} the "
                                        f"{args.target_ms:g} ms target with {len(fleet.models)} models")
    finally:
        if prometheus is not None:
            prometheus.stop()
        if database_ready and not args.keep:
            from django.db import connections

            connections.close_all()
            drop_database()
        if args.keep:
            log(f"kept {workdir} and database {BENCH_DATABASE}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    write_results(result, args.json, args.markdown)
    log(f"{result['verdict']}: {result['verdict_reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
