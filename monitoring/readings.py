"""Readings from Prometheus that decide what the fleet does, with no ORM: host memory for placement,
request rates for idle unloads, queue times for the autoscaler; and what the gateways measured of the
models on demand, for the model and host pages.

The deployments app (``placement``, ``lifecycle``, ``autoscale``, the host page) and the pages read these; they sit
below every app in the layers (docs/architecture.md), with ``promql`` and ``prometheus``. The
dashboard's per-model summaries, which need the registry, are ``monitoring.services``.
"""

from modelyard.errors import ServiceUnavailable
from monitoring import promql
from monitoring.prometheus import PrometheusClient, PrometheusUnavailable


def host_metrics(host_names: list[str], *, client: PrometheusClient | None = None) -> dict[str, dict]:
    """Current GPU and CPU gauges of the given hosts.

    Returns:
        ``{host: {"gpus": [{"gpu_uuid", "memory_used", "memory_total" (bytes), "utilization"
        (0..1)}], "cpu": {"memory_used", "memory_total" (bytes), "utilization" (0..1)}}}``; a
        host without GPUs has an empty list, a value None when not exported.

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    client = client or PrometheusClient()
    hosts = {name: {"gpus": {}, "cpu": {"memory_used": None, "memory_total": None, "utilization": None}}
             for name in host_names}
    if not hosts:
        return {}
    try:
        for field, query in promql.gpu_queries(host_names).items():
            for sample in client.instant(query):
                host = hosts.get(sample.labels.get("host"))
                if host is not None:
                    uuid = sample.labels.get("gpu_uuid", "")
                    gpu = host["gpus"].setdefault(uuid, {"gpu_uuid": uuid, "memory_used": None,
                                                         "memory_total": None, "utilization": None})
                    gpu[field] = sample.value
        for field, query in promql.cpu_queries(host_names).items():
            for sample in client.instant(query):
                host = hosts.get(sample.labels.get("host"))
                if host is not None:
                    host["cpu"][field] = sample.value
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    return {
        name: {"gpus": sorted(h["gpus"].values(), key=lambda g: g["gpu_uuid"]), "cpu": h["cpu"]}
        for name, h in hosts.items()
    }


def host_memory(host_names: list[str], *, client: PrometheusClient | None = None) -> list[dict]:
    """Current CPU and GPU memory of the given hosts in bytes, GPUs summed per host.

    Returns:
        One dict per host, in the given order: ``{"host", "gpu_used", "gpu_total", "cpu_used",
        "cpu_total"}``; GPU values None on a host without GPUs.

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    found = host_metrics(host_names, client=client)
    rows = []
    for name in host_names:
        gpus, cpu = found[name]["gpus"], found[name]["cpu"]
        rows.append({
            "host": name,
            "gpu_used": sum(g["memory_used"] or 0 for g in gpus) if gpus else None,
            "gpu_total": sum(g["memory_total"] or 0 for g in gpus) if gpus else None,
            "cpu_used": cpu["memory_used"], "cpu_total": cpu["memory_total"],
        })
    return rows



def requests_per_host_model(
    *, window_seconds: int, client: PrometheusClient | None = None
) -> dict[tuple[str, str], float]:
    """Requests answered per (host, model) over the last ``window_seconds`` (``promql.requests_per_host_model``).

    Returns:
        ``{(host, model): requests}``; pairs Prometheus has no series for are absent.

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    return _per_host_model(promql.requests_per_host_model(window_seconds), client)


def _per_host_model(query: str, client: PrometheusClient | None) -> dict[tuple[str, str], float]:
    client = client or PrometheusClient()
    try:
        samples = client.instant(query)
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    return {(s.labels.get("host", ""), s.labels.get("model", "")): s.value for s in samples}


def queue_ms_per_host_model(
    *, window_seconds: int, client: PrometheusClient | None = None
) -> dict[tuple[str, str], float]:
    """Mean queue time in ms per (host, model) over ``window_seconds`` (``promql.queue_ms_per_host_model``).

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    return _per_host_model(promql.queue_ms_per_host_model(window_seconds), client)


def on_demand_measured(selector: dict, *, by: str, window_seconds: int,
                       client: PrometheusClient | None = None) -> dict[str, dict]:
    """What the gateways measured of the models on demand that ``selector`` names (``{"model": name}``, or
    ``{"host": name}``) over the last ``window_seconds``, by the label ``by`` ("host" or "model"); six queries,
    whatever the number of hosts and models (``promql.on_demand``).

    Returns:
        ``{host or model: {"hits", "cold" (requests held for a load), "refused" ({reason: requests answered
        503}), "hit_rate" (0..1, None without requests), "cold_p50_ms", "cold_p99_ms" (None without a cold
        start), "load_p50_ms", "load_p99_ms" (the agent's loads as long as Triton took them; None without a
        load), "evictions" ({reason: count})}}``; one without on-demand series is left out.

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    client = client or PrometheusClient()
    queries = promql.on_demand(selector, window_seconds)
    try:
        results = client.gather({key: (lambda q=query: client.instant(q)) for key, query in queries.items()})
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    table: dict[str, dict] = {}

    def row(labels: dict) -> dict:
        return table.setdefault(labels.get(by, ""), {"hits": 0, "cold": 0, "refused": {}, "hit_rate": None,
                                                     "cold_p50_ms": None, "cold_p99_ms": None, "load_p50_ms": None,
                                                     "load_p99_ms": None, "evictions": {}})

    for sample in results["requests"]:
        entry, outcome = row(sample.labels), sample.labels.get("outcome", "")
        count = round(sample.value)
        if outcome in ("hit", "cold"):
            entry["hits" if outcome == "hit" else "cold"] += count
        elif count:
            entry["refused"][outcome] = count
    for sample in results["evictions"]:
        if round(sample.value):
            row(sample.labels)["evictions"][sample.labels.get("reason", "")] = round(sample.value)
    for key in ("cold_p50", "cold_p99", "load_p50", "load_p99"):
        for sample in results[key]:  # finite only: NaN without a cold start (or a load) never reaches here
            row(sample.labels)[f"{key}_ms"] = sample.value * 1000
    for entry in table.values():
        asked = entry["hits"] + entry["cold"]
        entry["hit_rate"] = entry["hits"] / asked if asked else None
    return table
