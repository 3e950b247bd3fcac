"""Driving Triton's perf_analyzer: one concurrency level of one loaded config per run.

perf_analyzer (Triton's own load generator, from the tritonclient 2.41 wheel; installed by
``scripts/install_perf_analyzer.sh``) measures in windows of ``--measurement-interval``
milliseconds until three consecutive windows agree within ``--stability-percentage`` (its
stability rule; it gives up after ``--max-trials`` windows and exits non-zero). Its ``-f`` CSV
holds, per level, the throughput and the client's p50/p90/p95/p99 latency, and the server's
split of a request's time into queue and compute, all in microseconds (perf_analyzer's
docs/measurements_metrics.md). This module builds the command, runs it so that a cancel or the
profile's deadline stops it within a second, and reads the CSV into a ``contract.ProfileRow``.
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

POLL_SECONDS = 0.25
# What perf_analyzer prints when no three consecutive windows agree within the stability percentage.
UNSTABLE = "Failed to obtain stable measurement"
# The longest window perf_analyzer is given when a level is measured again (the sweep's own bound).
MAX_INTERVAL_MS = 30_000
# The CSV's columns (microseconds, but the throughput), as perf_analyzer 2.41 names them.
COMPUTE_COLUMNS = ("Server Compute Input", "Server Compute Infer", "Server Compute Output")


class LoadGeneratorError(Exception):
    """A load generator could not run or measure; the message says why (its last output lines)."""


class Stopped(Exception):
    """A run was stopped: the profile was cancelled or ran out of time (``reason``)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def find_binary(configured: str, name: str) -> str:
    """The path of a load generator: ``configured`` when it names a file, else found on PATH.

    Raises:
        LoadGeneratorError: neither exists (the message names the agent flag and the install step).
    """
    found = configured if Path(configured).is_file() else shutil.which(configured or name)
    if not found:
        raise LoadGeneratorError(f"{name} not found ({configured!r}): install it with "
                                 f"scripts/install_perf_analyzer.sh, or point --{name.replace('_', '-')} at it")
    return found


def write_input_data(path: Path, sample_input: dict | None, signature: dict, max_batch_size: int) -> list[str]:
    """Write perf_analyzer's ``--input-data`` file from the version's sample input.

    perf_analyzer sends batch size 1 and cycles through the file's entries; a batching model's
    sample (whose first dimension is the batch) becomes one entry per sample row, a model that
    does not batch gets the whole sample as one entry. Without a sample input the inputs are
    random, and variable dimensions (-1) are given as 1 with ``--shape``.

    Args:
        path: where to write the JSON file.
        sample_input: ``{input name: nested list}`` or None.
        signature: the version's signature (input names, data types and dims).
        max_batch_size: the version's ``max_batch_size``.

    Returns:
        The extra perf_analyzer arguments: ``["--input-data", path]`` or ``["--input-data", "random",
        "--shape", "name:1,4", ...]``.
    """
    import numpy as np

    if not sample_input:
        args = ["--input-data", "random"]
        for spec in signature.get("inputs", []):
            dims = [int(d) for d in spec.get("dims", [])]
            if any(d < 0 for d in dims):
                args += ["--shape", f"{spec['name']}:{','.join(str(d if d > 0 else 1) for d in dims)}"]
        return args
    arrays = {name: np.asarray(values) for name, values in sample_input.items()}
    if max_batch_size > 0:
        rows = min(len(a) for a in arrays.values())
        entries = [{name: {"content": a[i].reshape(-1).tolist(), "shape": list(a[i].shape)}
                    for name, a in arrays.items()} for i in range(rows)]
    else:
        entries = [{name: {"content": a.reshape(-1).tolist(), "shape": list(a.shape)} for name, a in arrays.items()}]
    path.write_text(json.dumps({"data": entries}))
    return ["--input-data", str(path)]


def command(binary: str, *, inference_url: str, model: str, version: int, concurrency: int,
            measurement_interval_ms: int, stability_percentage: int, max_trials: int, csv_path: Path,
            input_args: list[str]) -> list[str]:
    """The perf_analyzer command line for one level over Triton's HTTP endpoint (KServe v2)."""
    address = urlsplit(inference_url).netloc or inference_url
    return [binary, "-m", model, "-x", str(version), "-u", address, "-i", "http", "-b", "1",
            "--concurrency-range", f"{concurrency}:{concurrency}", "--measurement-interval",
            str(measurement_interval_ms), "--stability-percentage", str(stability_percentage),
            "--max-trials", str(max_trials), "-f", str(csv_path), *input_args]


def measure(binary: str, *, inference_url: str, model: str, version: int, concurrency: int,
            measurement_interval_ms: int, stability_percentage: int, max_trials: int, csv_path: Path,
            input_args: list[str], deadline: float, should_stop: Callable[[], str | None]) -> dict:
    """Measure one concurrency level of a loaded model: ``command``, ``run`` and ``read_csv``.

    A level whose windows did not stabilise (perf_analyzer's "Failed to obtain stable measurement")
    is measured once more with windows twice as long, as perf_analyzer itself advises: on a shared
    host a burst of other work can keep 2 s windows from agreeing for a whole run, and a level left
    unmeasured is a config the recommendation never sees (the best one, as often as any).

    Args:
        binary, inference_url, model, version, concurrency, measurement_interval_ms,
        stability_percentage, max_trials, csv_path, input_args: as for ``command``.
        deadline, should_stop: as for ``run``; the second run is made only when its least time
            (three of its windows) fits before the deadline.

    Returns:
        ``read_csv``'s figures plus ``measurement_interval_ms``, the window (milliseconds) of the run
        that measured them.

    Raises:
        Stopped: as ``run``.
        LoadGeneratorError: perf_analyzer failed for another reason, or did not stabilise twice.
    """
    interval = measurement_interval_ms
    while True:
        args = command(binary, inference_url=inference_url, model=model, version=version, concurrency=concurrency,
                       measurement_interval_ms=interval, stability_percentage=stability_percentage,
                       max_trials=max_trials, csv_path=csv_path, input_args=input_args)
        try:
            run(args, deadline=deadline, should_stop=should_stop, log_path=csv_path.with_suffix(".log"))
            return {**read_csv(csv_path), "measurement_interval_ms": interval}
        except LoadGeneratorError as exc:
            if interval != measurement_interval_ms:
                raise LoadGeneratorError(f"{exc} (measured again with {interval} ms windows, after "
                                         f"{measurement_interval_ms} ms ones)") from exc
            longer = min(2 * measurement_interval_ms, MAX_INTERVAL_MS)
            if UNSTABLE not in str(exc) or longer == interval or time.monotonic() + 3 * longer / 1000 > deadline:
                raise
            interval = longer


def run(args: list[str], *, deadline: float, should_stop: Callable[[], str | None], log_path: Path) -> None:
    """Run a load generator until it exits, stopping it when ``should_stop`` gives a reason or the
    ``deadline`` (``time.monotonic()`` seconds) passes.

    Raises:
        Stopped: stopped early; the reason is ``should_stop``'s or "the profile's time budget ran out".
        LoadGeneratorError: it exited non-zero (the message holds its last output lines).
    """
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        while process.poll() is None:
            reason = should_stop() or ("the profile's time budget ran out" if time.monotonic() > deadline else None)
            if reason:
                raise Stopped(reason)
            time.sleep(POLL_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        tail = " ".join(log_path.read_text(errors="replace").strip().splitlines()[-2:])
        raise LoadGeneratorError(f"{Path(args[0]).name} exited with {process.returncode}: {tail[-400:]}")


def read_csv(csv_path: Path) -> dict:
    """The measurements of a one-level perf_analyzer CSV.

    Returns:
        ``{"throughput": inferences/s, "p50_ms", "p90_ms", "p95_ms", "p99_ms", "queue_ms",
        "compute_ms"}``: client latency percentiles and the server's average queue and compute time
        per request (input + infer + output), milliseconds.

    Raises:
        LoadGeneratorError: the file is missing or holds no row.
    """
    try:
        with csv_path.open(newline="") as handle:
            row = next(csv.DictReader(handle))
    except (OSError, StopIteration) as exc:
        raise LoadGeneratorError(f"perf_analyzer wrote no measurement to {csv_path.name}") from exc

    def ms(column: str) -> float:
        return round(float(row[column]) / 1000, 4)

    return {"throughput": round(float(row["Inferences/Second"]), 2),
            "p50_ms": ms("p50 latency"), "p90_ms": ms("p90 latency"), "p95_ms": ms("p95 latency"),
            "p99_ms": ms("p99 latency"), "queue_ms": ms("Server Queue"),
            "compute_ms": round(sum(float(row[c]) for c in COMPUTE_COLUMNS) / 1000, 4)}
