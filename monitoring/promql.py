"""The PromQL catalogue: every query the product sends to Prometheus.

Where the host's front measures the traffic (a Triton host's gateway, a BentoML host's nginx with its Lua
module: ``modelyard_metrics.lua``), latency,
request counts and errors come from it first, as ``<gateway> or <Triton> or <BentoML>``: it sees every
request as its client does, the same way for every version, and its histogram
(``modelyard_gateway_request_duration_seconds``) aggregates across hosts and over any window, which
Triton's windowed summaries cannot. Its series are read for the roles clients get answers from (``stable``,
``canary``, ``pinned``; not ``shadow`` copies, nor requests refused before they were routed). A version
Prometheus has no gateway series of (a host without a gateway, a BentoML host) falls back to the runtime's
own series. Each query also gives one meaning for both serving runtimes, as ``<Triton> or <BentoML>``:

- Triton series (https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/
  user_guide/metrics.html) carry ``model`` and ``version`` labels themselves.
- BentoML series (``bentoml_service_request_*``) carry neither: each BentoML process serves one
  model version, and its scrape target attaches ``model`` and ``version``. Health and metrics
  probes (``/livez``, ``/readyz``, ``/healthz``, ``/metrics``) are excluded.

Every counter is read with one rule (``_increase``, and ``_rate_sum`` for rates): a series first seen inside the
window counts its whole value, where ``increase()`` and ``rate()`` would lose what its first sample already held
(a burst right after a deployment, before the next scrape). The gateway's counters start at 0 when nginx
starts or a version starts serving there, Triton's when a version loads, BentoML's with their first request:
a series first seen inside a window holds nothing from before it. The runtime's counters are aggregated
``sum by (model, version)``: per-model series vanish on unload and restart from zero on reload, and split by
``gpu_uuid`` and by scrape target. (A target Prometheus starts scraping late, a host added to a running
fleet, has every series first seen then: its counts since it started fall in that first window.)

Every builder takes a label ``selector`` (``{"model": "iris"}``, or empty for the whole fleet; a ``NoneOf`` value
excludes values, ``{"host": NoneOf(("gpu-1",))}``) and a rate window in seconds; label values are escaped.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

RANGE_PATTERN = re.compile(r"([1-9][0-9]{0,3})([smhd])")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MIN_RANGE_SECONDS = 60
MAX_RANGE_SECONDS = 30 * 86400
MAX_POINTS = 300
MIN_STEP_SECONDS = 5
MIN_RATE_WINDOW_SECONDS = 30  # at least 4 samples at the 5 s scrape interval the shipped config uses
PAGE_RANGES = ("15m", "1h", "6h", "24h", "7d")
DEFAULT_PAGE_RANGE = PAGE_RANGES[0]
BENTO_PROBES = "/livez|/readyz|/healthz|/metrics"
BY = "model, version"


class InvalidRange(ValueError):
    """A range that is not ``<number><s|m|h|d>`` between 1 minute and 30 days."""


def parse_range(text: str) -> int:
    """Return the length in seconds of a range like ``15m``, ``6h``, ``7d``.

    Raises:
        InvalidRange: the text is malformed or outside 1 minute .. 30 days.
    """
    match = RANGE_PATTERN.fullmatch(text or "")
    if not match:
        raise InvalidRange(f"range must look like 15m, 1h, 6h, 24h or 7d, got {text!r}")
    seconds = int(match.group(1)) * UNIT_SECONDS[match.group(2)]
    if not MIN_RANGE_SECONDS <= seconds <= MAX_RANGE_SECONDS:
        raise InvalidRange(f"range must be between 1m and 30d, got {text!r}")
    return seconds


def page_range(value: str | None) -> str:
    """``value`` if it is one of the ranges the pages offer (``PAGE_RANGES``), else ``DEFAULT_PAGE_RANGE``."""
    return value if value in PAGE_RANGES else DEFAULT_PAGE_RANGE


def step_for(range_seconds: int) -> int:
    """Return a query step in seconds that keeps a series at ``MAX_POINTS`` points or fewer."""
    return max(MIN_STEP_SECONDS, -(-range_seconds // MAX_POINTS))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "")


class NoneOf(tuple):
    """A selector value that matches a label equal to none of the given values (``label!~"a|b"``)."""


class AnyOf(tuple):
    """A selector value that matches a label equal to one of the given values (``label=~"a|b"``; none: nothing)."""


def _matcher(key: str, value) -> str:
    if isinstance(value, NoneOf):
        return f'{key}!~"{_escape("|".join(re.escape(v) for v in value))}"'
    if isinstance(value, AnyOf):
        return f'{key}=~"{_escape("|".join(re.escape(v) for v in value) or "^$")}"'
    return f'{key}="{_escape(value)}"'


def _matchers(selector: dict[str, str], *extra: str) -> str:
    parts = [_matcher(key, value) for key, value in sorted(selector.items())]
    parts.extend(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _window(seconds: int) -> str:
    return f"{max(int(seconds), MIN_RATE_WINDOW_SECONDS)}s"


def _bento(selector: dict[str, str], *extra: str) -> str:
    return _matchers(selector, f'endpoint!~"{BENTO_PROBES}"', *extra)


def _increase(metric: str, matchers: str, w: str, by: str = BY) -> str:
    """What a counter rose by over the last ``w``, summed ``by``: the whole value of a series first seen inside
    the window (it started at 0 there) that has not reset since, else ``increase()``, which counts across
    resets. A series first seen inside the window that then reset (a version unloaded and loaded again, a
    process restarted) holds only its rise since the reset, so its whole value would lose what it counted
    before: ``increase()`` keeps that, less what its first sample held."""
    series = f"{metric}{matchers}"
    first_seen = f"({series} unless {series} offset {w})"
    return (f"sum by ({by})(({first_seen} unless resets({series}[{w}]) > 0)"
            f" or increase({series}[{w}]))")


def _rate_sum(metric: str, matchers: str, w: str, by: str = BY) -> str:
    """What a counter rose by per second over the last ``w``, summed ``by``: ``_increase`` over the window's
    seconds (as ``rate()``, which is ``increase()`` over them), so a series first seen inside the window counts."""
    return f"({_increase(metric, matchers, w, by)} / {w.removesuffix('s')})"


GATEWAY_REQUESTS = "modelyard_gateway_requests_total"
GATEWAY_LATENCY = "modelyard_gateway_request_duration_seconds"
GATEWAY_ROLES = 'role=~"stable|canary|pinned"'


def _gateway(selector: dict[str, str], *extra: str) -> str:
    return _matchers(selector, GATEWAY_ROLES, *extra)


def throughput(selector: dict[str, str], window: int, *, over_window: bool = False) -> str:
    """Inferences per second per version.

    Triton: ``nv_inference_count`` (inferences, counting each batch item).
    BentoML: ``bentoml_service_request_total`` (requests; one request is one inference).
    """
    w = _window(window)
    return (
        f"{_rate_sum('nv_inference_count', _matchers(selector), w)}"
        f" or {_rate_sum('bentoml_service_request_total', _bento(selector), w)}"
    )


def requests_in_window(selector: dict[str, str], window: int) -> str:
    """Requests answered per version over the last ``window`` seconds (successes and failures).

    Gateway: ``modelyard_gateway_requests_total`` of every status class.
    Triton: ``nv_inference_request_success`` and ``nv_inference_request_failure`` (requests; the failure
    counter is split by ``reason``, so both are summed per version first).
    BentoML: ``bentoml_service_request_total`` without health probes.
    Each counted with ``_increase``, which copes with counter resets and counts a series first seen inside
    the window whole; a version Prometheus has no series of gives no row.
    """
    w = _window(window)
    names = '__name__=~"nv_inference_request_success|nv_inference_request_failure"'
    triton = _increase("", _matchers(selector, names), w)
    bento = _increase("bentoml_service_request_total", _bento(selector), w)
    gateway = _increase(GATEWAY_REQUESTS, _gateway(selector), w)
    return f"({gateway}) or ({triton}) or {bento}"


def latency_mean_ms(selector: dict[str, str], window: int, *, over_window: bool = False) -> str:
    """Mean request latency in milliseconds per version over the window, from counters.

    Gateway: the histogram's ``_sum`` / ``_count`` (s).
    Triton: ``nv_inference_request_duration_us`` / ``nv_inference_request_success`` (µs), each the rise of
    the counter over the window (``_rate_sum``).
    Triton's metrics guide (user_guide/metrics.md, "Latencies": "Counters" and "Summaries") gives
    ``nv_inference_request_duration_us`` as the cumulative end-to-end handling time of requests,
    adds to it only for successful ones (and their cache hits), and says the request summary's
    ``_count`` matches ``nv_inference_request_success``: that counter, which counts a request
    once whatever its batch, is the denominator. ``nv_inference_count`` is not: it counts each
    batch item and leaves out cached requests, so it would divide one request's time by its
    batch size. A ratio of two rates holds a value whenever the window holds traffic, also
    after the traffic paused and Triton's latency summary emptied (``latency_quantile_ms``).
    BentoML: ``bentoml_service_request_duration_seconds`` histogram ``_sum`` / ``_count`` (s).
    """
    w = _window(window)
    triton = (
        f"{_rate_sum('nv_inference_request_duration_us', _matchers(selector), w)}"
        f" / {_rate_sum('nv_inference_request_success', _matchers(selector), w)} / 1000"
    )
    bento = (
        f"{_rate_sum('bentoml_service_request_duration_seconds_sum', _bento(selector), w)}"
        f" / {_rate_sum('bentoml_service_request_duration_seconds_count', _bento(selector), w)} * 1000"
    )
    gateway = (f"{_increase(GATEWAY_LATENCY + '_sum', _gateway(selector), w)}"
               f" / {_increase(GATEWAY_LATENCY + '_count', _gateway(selector), w)} * 1000")
    return f"({gateway}) or ({triton}) or ({bento})"


def latency_quantile_ms(
    selector: dict[str, str], window: int, *, quantile: float, over_window: bool = False
) -> str:
    """Request latency quantile (0.5, 0.95, 0.99) in milliseconds per version.

    Gateway: ``histogram_quantile`` over the requests of the window (``_increase`` of
    ``modelyard_gateway_request_duration_seconds_bucket``, summed across hosts by ``le``): exact to the
    bucket the quantile falls in (``modelyard_metrics.lua``'s bounds, 0.25 ms to 30 s in 1-2.5-5 steps),
    linear inside it; NaN for a window without requests. ``over_window`` changes nothing: a histogram
    covers the whole window either way.
    Triton: the summary ``nv_inference_request_summary_us{quantile=...}`` (µs; enabled with
    ``--metrics-config summary_latencies=true``). Its quantiles cover Triton's own sliding window
    of the last 60 s and read NaN once that window holds no request, though the counters show
    traffic earlier in the range: a quantile is only given where the summary held data. With
    ``over_window`` it is the worst value the summary held during the window (``max_over_time``
    passes over NaN samples), so a pause in the traffic does not blank it; without, the latest
    (one chart point). Summaries cannot be averaged across targets, so the worst target is taken.
    BentoML: ``histogram_quantile`` over ``bentoml_service_request_duration_seconds_bucket`` (s).
    """
    w = _window(window)
    quantile_matcher = f'quantile="{quantile}"'
    summary = f"nv_inference_request_summary_us{_matchers(selector, quantile_matcher)}"
    if over_window:
        summary = f"max_over_time({summary}[{w}])"
    buckets = _increase("bentoml_service_request_duration_seconds_bucket", _bento(selector), w, by=f"{BY}, le")
    gateway = _increase(GATEWAY_LATENCY + "_bucket", _gateway(selector), w, by=f"{BY}, le")
    return (f"(histogram_quantile({quantile}, {gateway}) * 1000) or (max by ({BY})({summary}) / 1000)"
            f" or (histogram_quantile({quantile}, {buckets}) * 1000)")


def error_rate(selector: dict[str, str], window: int, *, over_window: bool = False) -> str:
    """Failed requests as a fraction (0..1) of all requests per version; 0 without failures.

    Gateway: requests answered 5xx / all requests (a 4xx is the client's error).
    Triton: failure / (failure + success) from ``nv_inference_request_failure`` and
    ``nv_inference_request_success``, written ``1 / (1 + success / failure)`` so the failure
    counter (split by ``reason``) is read once: no failures gives success/0 = +Inf and so 0;
    no requests at all gives NaN, which is "no data".
    BentoML: requests answered 5xx / all requests, from ``bentoml_service_request_total``.
    """
    w = _window(window)
    failure = _rate_sum("nv_inference_request_failure", _matchers(selector), w)
    success = _rate_sum("nv_inference_request_success", _matchers(selector), w)
    total = _rate_sum("bentoml_service_request_total", _bento(selector), w)
    errors = _rate_sum("bentoml_service_request_total", _bento(selector, 'http_response_code=~"5.."'), w)
    gateway_total = _increase(GATEWAY_REQUESTS, _gateway(selector), w)
    gateway_errors = _increase(GATEWAY_REQUESTS, _gateway(selector, 'code="5xx"'), w)
    return (f"(({gateway_errors} or 0 * {gateway_total}) / {gateway_total})"
            f" or (1 / (1 + {success} / {failure})) or (({errors} or 0 * {total}) / clamp_min({total}, 1e-12))")


def queue_ms(selector: dict[str, str], window: int, *, over_window: bool = False) -> str:
    """Mean time a request waits in the scheduler queue, in milliseconds (Triton only).

    ``nv_inference_queue_duration_us`` / ``nv_inference_request_success`` (``_rate_sum``): like the request
    time, the queue time adds up per successful request, cache hits included (Triton's metrics
    guide: the queue summary's ``_count`` matches ``nv_inference_request_success``). BentoML
    exports no queue time.
    """
    w = _window(window)
    return (
        f"{_rate_sum('nv_inference_queue_duration_us', _matchers(selector), w)}"
        f" / {_rate_sum('nv_inference_request_success', _matchers(selector), w)} / 1000"
    )


def compute_ms(selector: dict[str, str], window: int, *, over_window: bool = False) -> str:
    """Mean compute time per computed request in milliseconds (Triton only).

    (``nv_inference_compute_input_duration_us`` + ``..._infer_...`` + ``..._output_...``) over the
    requests that reached the backend: ``nv_inference_request_success`` less the response cache's
    hits ``nv_cache_num_hits_per_model`` (absent, so taken as none, without a response cache), since
    Triton's compute counters leave cached requests out.
    """
    w = _window(window)
    m = _matchers(selector)
    parts = " + ".join(_rate_sum(f"nv_inference_compute_{p}_duration_us", m, w) for p in ("input", "infer", "output"))
    success = _rate_sum("nv_inference_request_success", m, w)
    hits = _rate_sum("nv_cache_num_hits_per_model", m, w)
    return f"({parts}) / ({success} - ({hits} or 0 * {success})) / 1000"


def pending_requests(selector: dict[str, str], window: int, *, over_window: bool = False) -> str:
    """Requests waiting or in progress per version (a gauge: the latest value, or the worst in the window).

    Triton: ``nv_inference_pending_request_count``. BentoML: ``bentoml_service_request_in_progress``.
    """
    triton = f"nv_inference_pending_request_count{_matchers(selector)}"
    bento = f"bentoml_service_request_in_progress{_bento(selector)}"
    if over_window:
        w = _window(window)
        triton, bento = f"max_over_time({triton}[{w}])", f"max_over_time({bento}[{w}])"
    return f"sum by ({BY})({triton}) or sum by ({BY})({bento})"


TRAFFIC_ROLES = 'role=~"stable|canary|pinned|shadow"'
TRAFFIC_BY = "host, version, role"
LAST_MINUTE_SECONDS = 60


def traffic_by_host(selector: dict[str, str], window: int, *, by: str = TRAFFIC_BY) -> dict[str, str]:
    """Per (host, version, role) of one model, from the hosts' fronts (``modelyard_gateway_*``): what answers
    "which version serves on which host, with what share of traffic, and what is its p99 right now?".

    Returns:
        ``{"requests": requests over the window, "errors": of them answered 5xx, "requests_minute": requests over
        the last minute, "p99_ms": p99 latency over the window (ms), "p99_minute_ms": over the last minute}``,
        each a query ``by`` its labels (default ``host, version, role``; roles ``stable``, ``canary``,
        ``pinned``, ``shadow``), counted with ``_increase``.
    """
    w, minute = _window(window), f"{LAST_MINUTE_SECONDS}s"
    roles = _matchers(selector, TRAFFIC_ROLES)
    errors = _matchers(selector, TRAFFIC_ROLES, 'code="5xx"')

    def p99(span: str) -> str:
        buckets = _increase(GATEWAY_LATENCY + "_bucket", roles, span, by=f"{by}, le")
        return f"histogram_quantile(0.99, {buckets}) * 1000"

    return {
        "requests": _increase(GATEWAY_REQUESTS, roles, w, by=by),
        "errors": _increase(GATEWAY_REQUESTS, errors, w, by=by),
        "requests_minute": _increase(GATEWAY_REQUESTS, roles, minute, by=by),
        "p99_ms": p99(w),
        "p99_minute_ms": p99(minute),
    }


@dataclass(frozen=True)
class MetricQuery:
    """One per-version metric: its key, title, unit, and PromQL builder.

    ``build(selector, window_seconds, over_window=False) -> str``; ``over_window`` asks gauges
    and summaries for the worst value during the window instead of the latest one.
    """

    key: str
    title: str
    unit: str
    build: Callable[..., str]


MODEL_METRICS: tuple[MetricQuery, ...] = (
    MetricQuery("throughput", "Throughput", "inferences/s", throughput),
    MetricQuery("latency_mean_ms", "Mean latency", "ms", latency_mean_ms),
    MetricQuery("latency_p50_ms", "p50 latency", "ms", partial(latency_quantile_ms, quantile=0.5)),
    MetricQuery("latency_p95_ms", "p95 latency", "ms", partial(latency_quantile_ms, quantile=0.95)),
    MetricQuery("latency_p99_ms", "p99 latency", "ms", partial(latency_quantile_ms, quantile=0.99)),
    MetricQuery("error_rate", "Error rate", "fraction (0..1)", error_rate),
    MetricQuery("queue_ms", "Queue time", "ms", queue_ms),
    MetricQuery("compute_ms", "Compute time", "ms", compute_ms),
    MetricQuery("pending_requests", "Pending requests", "requests", pending_requests),
)
METRICS_BY_KEY = {m.key: m for m in MODEL_METRICS}


def _host_matchers(hosts: list[str]) -> str:
    names = "|".join(re.escape(h) for h in hosts) or "^$"
    return f'{{host=~"{_escape(names)}"}}'


def gpu_queries(hosts: list[str]) -> dict[str, str]:
    """Per-GPU gauges of the given hosts, by ``host`` and ``gpu_uuid``.

    ``nv_gpu_memory_used_bytes`` and ``nv_gpu_memory_total_bytes`` (bytes),
    ``nv_gpu_utilization`` (0..1). Absent on hosts without GPUs.
    """
    m = _host_matchers(hosts)
    return {
        "memory_used": f"max by (host, gpu_uuid)(nv_gpu_memory_used_bytes{m})",
        "memory_total": f"max by (host, gpu_uuid)(nv_gpu_memory_total_bytes{m})",
        "utilization": f"max by (host, gpu_uuid)(nv_gpu_utilization{m})",
    }


def cpu_queries(hosts: list[str]) -> dict[str, str]:
    """Per-host CPU gauges: ``nv_cpu_memory_used_bytes``/``_total_bytes`` (bytes), ``nv_cpu_utilization`` (0..1)."""
    m = _host_matchers(hosts)
    return {
        "memory_used": f"max by (host)(nv_cpu_memory_used_bytes{m})",
        "memory_total": f"max by (host)(nv_cpu_memory_total_bytes{m})",
        "utilization": f"max by (host)(nv_cpu_utilization{m})",
    }


def requests_per_host_model(window: int) -> str:
    """Requests each (host, model) answered over the last ``window`` seconds, all versions together.

    Triton: ``nv_inference_request_success`` + ``nv_inference_request_failure`` (requests);
    BentoML: ``bentoml_service_request_total`` without health probes. ``increase()`` copes with
    counter resets; a series absent from Prometheus gives no row (unknown, not zero).
    """
    w = _window(window)
    by = "host, model"
    # Each counter summed per (host, model) before they are added: added series by series they matched nothing,
    # as Triton labels its failures with a ``reason`` its successes lack; a model with only one of them counts it.
    success = f"sum by ({by})(increase(nv_inference_request_success[{w}]))"
    failure = f"sum by ({by})(increase(nv_inference_request_failure[{w}]))"
    triton = f"({success} + {failure}) or {success} or {failure}"
    bento = f"sum by ({by})(increase(bentoml_service_request_total{_bento({})}[{w}]))"
    return f"({triton}) or {bento}"


def queue_ms_per_host_model(window: int) -> str:
    """Mean time a request waited in Triton's queue per (host, model), all versions together, in ms.

    ``nv_inference_queue_duration_us`` (µs, cumulative) / ``nv_inference_request_success``; BentoML
    exports no queue time, so BentoML models have no row.
    """
    w = _window(window)
    by = "host, model"
    return (f"sum by ({by})(rate(nv_inference_queue_duration_us[{w}]))"
            f" / sum by ({by})(rate(nv_inference_request_success[{w}])) / 1000")


ON_DEMAND_REQUESTS = "modelyard_on_demand_requests_total"
COLD_STARTS = "modelyard_cold_start_seconds"
LOADS = "modelyard_model_load_seconds"
EVICTIONS = "modelyard_evictions_total"


def on_demand_refused(window: int) -> str:
    """Requests the gateways refused with a 503 for models on demand over the last ``window`` seconds, by
    ``model`` and ``outcome`` (``timeout``, ``queue_full``, ``load_failed``, ``no_loader``; not the hits and
    cold starts they served), summed over hosts, as ``_increase`` counts them."""
    return _increase(ON_DEMAND_REQUESTS, '{outcome!~"hit|cold"}', _window(window), by="model, outcome")


def on_demand(selector: dict[str, str], window: int) -> dict[str, str]:
    """The queries of the on-demand panel, per host and model over the last ``window`` seconds, from the
    gateways' own series (``modelyard_residency.lua``): ``requests`` by ``outcome`` (hit, cold, and the 503
    reasons), the ``cold_p50`` and ``cold_p99`` of the waits (seconds, ``histogram_quantile`` of
    ``modelyard_cold_start_seconds``; NaN without a cold start), the ``load_p50`` and ``load_p99`` of the host
    agent's loads that succeeded (seconds Triton took, ``modelyard_model_load_seconds{outcome="loaded"}``; NaN
    without one) and ``evictions`` by
    ``reason``. Each counter's rise as ``_increase`` takes it, so the first cold starts after a model is registered
    count."""
    w, matchers = _window(window), _matchers(selector)
    out = {
        "requests": _increase(ON_DEMAND_REQUESTS, matchers, w, by="host, model, outcome"),
        "evictions": _increase(EVICTIONS, matchers, w, by="host, model, reason"),
    }
    for kind, family, only in (("cold", COLD_STARTS, ()), ("load", LOADS, ('outcome="loaded"',))):
        buckets = _increase(family + "_bucket", _matchers(selector, *only), w, by="host, model, le")
        for q in (50, 99):
            out[f"{kind}_p{q}"] = f"histogram_quantile({q / 100}, {buckets})"
    return out
