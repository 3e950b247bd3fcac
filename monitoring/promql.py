"""The PromQL catalogue: every query the product sends to Prometheus.

Source metrics are Triton's (https://docs.nvidia.com/deeplearning/triton-inference-server/
user-guide/docs/user_guide/metrics.html). Counters are only read through
``rate()`` and aggregated ``sum by (model, version)``: per-model series vanish
on unload and restart from zero on reload, and one model's series split by
``gpu_uuid`` and by scrape target.

Every builder takes already-validated values; label values are escaped anyway.
"""

import re

RANGE_PATTERN = re.compile(r"^([1-9][0-9]{0,3})([smhd])$")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_RANGE_SECONDS = 60
MAX_RANGE_SECONDS = 30 * 86400
MAX_POINTS = 300
MIN_STEP_SECONDS = 5
MIN_RATE_WINDOW_SECONDS = 30  # at least 4 samples at the 5 s scrape interval the shipped config uses


class InvalidRange(ValueError):
    """A range that is not ``<number><s|m|h|d>`` between 1 minute and 30 days."""


def parse_range(text: str) -> int:
    """Return the length in seconds of a range like ``15m``, ``6h``, ``7d``.

    Raises:
        InvalidRange: the text is malformed or outside 1 minute .. 30 days.
    """
    match = RANGE_PATTERN.match(text or "")
    if not match:
        raise InvalidRange(f"range must look like 15m, 1h, 6h, 24h or 7d, got {text!r}")
    seconds = int(match.group(1)) * UNIT_SECONDS[match.group(2)]
    if not MIN_RANGE_SECONDS <= seconds <= MAX_RANGE_SECONDS:
        raise InvalidRange(f"range must be between 1m and 30d, got {text!r}")
    return seconds


def step_for(range_seconds: int) -> int:
    """Return a query step in seconds that keeps a series at ``MAX_POINTS`` points or fewer."""
    return max(MIN_STEP_SECONDS, -(-range_seconds // MAX_POINTS))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "")


def _window(seconds: int) -> str:
    return f"{max(seconds, MIN_RATE_WINDOW_SECONDS)}s"


def throughput(model: str, window_seconds: int) -> str:
    """Inferences per second per version, from the counter ``nv_inference_count``."""
    sel = f'{{model="{_label(model)}"}}'
    return f"sum by (model, version)(rate(nv_inference_count{sel}[{_window(window_seconds)}]))"


def latency_mean_ms(model: str, window_seconds: int) -> str:
    """Mean request latency in milliseconds per version.

    ``nv_inference_request_duration_us`` (microseconds, cumulative) over
    ``nv_inference_request_success`` (requests), divided by 1000.
    """
    sel = f'{{model="{_label(model)}"}}'
    w = _window(window_seconds)
    return (
        f"(sum by (model, version)(rate(nv_inference_request_duration_us{sel}[{w}]))"
        f" / sum by (model, version)(rate(nv_inference_request_success{sel}[{w}]))) / 1000"
    )


def latency_p95_ms(model: str, window_seconds: int, *, over_range: bool) -> str:
    """95th percentile request latency in milliseconds per version.

    From Triton's summary ``nv_inference_request_summary_us{quantile="0.95"}``
    (microseconds; enabled with ``--metrics-config summary_latencies=true``),
    whose quantiles cover Triton's own sliding window. Summaries cannot be
    averaged across targets, so the worst target is taken; with
    ``over_range`` the worst value seen during the window.
    """
    sel = f'{{model="{_label(model)}",quantile="0.95"}}'
    inner = f"nv_inference_request_summary_us{sel}"
    if over_range:
        inner = f"max_over_time({inner}[{_window(window_seconds)}])"
    return f"max by (model, version)({inner}) / 1000"


def error_rate(model: str, window_seconds: int) -> str:
    """Failed requests as a fraction (0..1) of all requests per version.

    ``nv_inference_request_failure`` over failure + ``nv_inference_request_success``;
    0 when there were no requests.
    """
    sel = f'{{model="{_label(model)}"}}'
    w = _window(window_seconds)
    failure = f"sum by (model, version)(rate(nv_inference_request_failure{sel}[{w}]))"
    success = f"sum by (model, version)(rate(nv_inference_request_success{sel}[{w}]))"
    return f"{failure} / clamp_min({failure} + {success}, 1e-12)"


def host_memory_bytes(hosts: list[str]) -> dict[str, str]:
    """Queries for current memory per host in bytes, keyed by what they measure.

    ``nv_gpu_memory_*_bytes`` are per GPU (summed per host); ``nv_cpu_memory_*_bytes``
    are per server. The ``host`` label is attached by the scrape config.
    """
    names = "|".join(re.escape(h) for h in hosts) or "^$"
    sel = f'{{host=~"{_label(names)}"}}'
    return {
        "gpu_used": f"sum by (host)(nv_gpu_memory_used_bytes{sel})",
        "gpu_total": f"sum by (host)(nv_gpu_memory_total_bytes{sel})",
        "cpu_used": f"max by (host)(nv_cpu_memory_used_bytes{sel})",
        "cpu_total": f"max by (host)(nv_cpu_memory_total_bytes{sel})",
    }
