"""Metrics for models and hosts, read from Prometheus through the PromQL catalogue."""

from modelyard.errors import InvalidInput, ServiceUnavailable
from monitoring import promql
from monitoring.prometheus import PrometheusClient, PrometheusUnavailable
from registry.services import get_model

SUMMARY_FIELDS = ("throughput", "latency_mean_ms", "latency_p95_ms", "error_rate")


def _range_seconds(range_text: str) -> int:
    try:
        return promql.parse_range(range_text)
    except promql.InvalidRange as exc:
        raise InvalidInput(str(exc)) from exc


def _queries(model: str, seconds: int, *, over_range: bool) -> dict[str, str]:
    return {
        "throughput": promql.throughput(model, seconds),
        "latency_mean_ms": promql.latency_mean_ms(model, seconds),
        "latency_p95_ms": promql.latency_p95_ms(model, seconds, over_range=over_range),
        "error_rate": promql.error_rate(model, seconds),
    }


def model_metrics(model_name: str, range_text: str = "15m", *, client: PrometheusClient | None = None) -> dict:
    """Summarise one model's serving metrics per version over a range.

    Args:
        model_name: a registered model's name.
        range_text: the window, e.g. ``15m`` (see ``promql.parse_range``).
        client: the Prometheus client; defaults to one from settings.

    Returns:
        ``{"model", "range", "range_seconds", "versions": [{"version": str,
        "throughput": inferences/s, "latency_mean_ms": ms, "latency_p95_ms": ms,
        "error_rate": 0..1}]}``, versions in ascending order; a field is None
        when Prometheus has no data for it. One query per field, whatever the
        number of versions.

    Raises:
        NotFound: no such model.
        InvalidInput: malformed range.
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    model = get_model(model_name)
    seconds = _range_seconds(range_text)
    client = client or PrometheusClient()
    by_version: dict[str, dict] = {}
    try:
        for field, query in _queries(model.name, seconds, over_range=True).items():
            for sample in client.instant(query):
                version = sample.labels.get("version", "")
                row = by_version.setdefault(version, {"version": version, **{f: None for f in SUMMARY_FIELDS}})
                row[field] = sample.value
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    versions = sorted(by_version.values(), key=lambda r: (len(r["version"]), r["version"]))
    return {"model": model.name, "range": range_text, "range_seconds": seconds, "versions": versions}


def model_series(model_name: str, range_text: str = "15m", *, client: PrometheusClient | None = None) -> dict:
    """Time series of one model's metrics per version, for charts.

    Returns:
        ``{"model", "range", "step": seconds, "series": {field: [{"version": str,
        "points": [[unix seconds, value], ...]}]}}`` with the fields of
        ``model_metrics``; at most ``promql.MAX_POINTS`` points per series.

    Raises:
        NotFound, InvalidInput, ServiceUnavailable: as ``model_metrics``.
    """
    model = get_model(model_name)
    seconds = _range_seconds(range_text)
    step = promql.step_for(seconds)
    client = client or PrometheusClient()
    series: dict[str, list] = {}
    try:
        for field, query in _queries(model.name, step, over_range=False).items():
            series[field] = [
                {"version": s.labels.get("version", ""), "points": [[t, v] for t, v in s.points]}
                for s in client.range(query, seconds=seconds, step=step)
            ]
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    return {"model": model.name, "range": range_text, "step": step, "series": series}


def host_memory(host_names: list[str], *, client: PrometheusClient | None = None) -> list[dict]:
    """Current CPU and GPU memory of the given hosts, in bytes.

    Returns:
        One dict per host name, in the given order: ``{"host", "gpu_used",
        "gpu_total", "cpu_used", "cpu_total"}``, a value None when not exported
        (no GPU: no ``nv_gpu_*`` series).

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    client = client or PrometheusClient()
    rows = {name: {"host": name, "gpu_used": None, "gpu_total": None, "cpu_used": None, "cpu_total": None}
            for name in host_names}
    if not rows:
        return []
    try:
        for field, query in promql.host_memory_bytes(host_names).items():
            for sample in client.instant(query):
                host = sample.labels.get("host")
                if host in rows:
                    rows[host][field] = sample.value
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    return [rows[name] for name in host_names]
