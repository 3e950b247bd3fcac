"""Driving wrk (Debian's HTTP load generator) for performance cards of BentoML versions.

wrk keeps ``-c`` connections busy for ``-d`` seconds and records every request's latency in an
HdrHistogram; its Lua ``done`` hook (``REPORT_SCRIPT``) prints the request count, the errors and
the p50/p90/p95/p99 latencies in microseconds as one JSON line, which ``read_report`` parses. The
request body is the version's sample input, posted as JSON to its first API route. wrk has no
stability rule of its own: each level runs for three measurement windows, and the result is the
level's mean over that time.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from modelyard_agent.profiling.perf_analyzer import LoadGeneratorError

MARKER = "MODELYARD-WRK "
# Reads the body from the file named after "--" on wrk's command line, posts it as JSON, and prints
# the summary (wrk's Lua API: init, done, summary.errors, latency:percentile; latencies in µs).
REPORT_SCRIPT = r"""
init = function(args)
  local file = assert(io.open(args[1], "rb"))
  wrk.method = "POST"
  wrk.body = file:read("*a")
  wrk.headers["Content-Type"] = "application/json"
  file:close()
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'MODELYARD-WRK {"requests": %d, "duration_us": %d, "errors": %d, "non_2xx": %d, ' ..
    '"p50_us": %d, "p90_us": %d, "p95_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(95), latency:percentile(99)))
end
"""


def command(binary: str, *, url: str, concurrency: int, seconds: float, script: Path, body: Path,
            timeout_seconds: float = 10.0) -> list[str]:
    """wrk's command line for one level: ``concurrency`` connections over ``min(concurrency, 4)``
    threads for ``seconds`` (whole seconds, at least 1)."""
    return [binary, "-t", str(min(concurrency, 4)), "-c", str(concurrency), "-d", f"{max(1, math.ceil(seconds))}s",
            "--timeout", f"{math.ceil(timeout_seconds)}s", "-s", str(script), url, "--", str(body)]


def read_report(log_path: Path) -> dict:
    """The measurements of one wrk run, from its output.

    Returns:
        ``{"throughput": requests/s, "p50_ms", "p90_ms", "p95_ms", "p99_ms", "errors": int}``;
        ``queue_ms`` and ``compute_ms`` are None (an HTTP client cannot see the server's split).

    Raises:
        LoadGeneratorError: no report line, or every request failed.
    """
    line = next((text for text in log_path.read_text(errors="replace").splitlines() if text.startswith(MARKER)), "")
    if not line:
        raise LoadGeneratorError("wrk printed no report")
    report = json.loads(line.removeprefix(MARKER))
    failed = report["errors"] + report["non_2xx"]
    if report["requests"] == 0 or failed >= report["requests"]:
        raise LoadGeneratorError(f"wrk: {failed} of {report['requests']} requests failed")
    seconds = report["duration_us"] / 1e6

    def ms(name: str) -> float:
        return round(report[name] / 1000, 4)

    return {"throughput": round((report["requests"] - failed) / seconds, 2), "p50_ms": ms("p50_us"),
            "p90_ms": ms("p90_us"), "p95_ms": ms("p95_us"), "p99_ms": ms("p99_us"), "queue_ms": None,
            "compute_ms": None, "errors": failed}
