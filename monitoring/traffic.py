"""The traffic tables, measured at the hosts' fronts (``promql.traffic_by_host``): a model's host × version table,
a host's model × version table, a canary beside its stable version, and the whole fleet grouped by host."""

from modelyard.errors import ServiceUnavailable
from monitoring import promql
from monitoring.prometheus import PrometheusClient, PrometheusUnavailable
from monitoring.services import model_selector, version_sort_key

ROLE_ORDER = {"stable": 0, "canary": 1, "pinned": 2, "shadow": 3}


def traffic_table(model_name: str, *, window_seconds: int, hosts: list[str] | None = None, by_host: bool = True,
                  client: PrometheusClient | None = None) -> list[dict]:
    """The host × version table of one model: one row per version each host's front answered for it, by role.

    Five queries, whatever the number of hosts (``promql.traffic_by_host``). ``hosts`` keeps those hosts' series
    only; with ``by_host`` False the hosts are summed (one row per version and role, ``host`` ""; shares of
    all their requests that named no version), as a canary's page compares it with the stable version.

    Returns:
        ``[{"host", "version" (str, as labelled), "role" ("stable", "canary", "pinned", "shadow"), "requests"
        (count over the window), "share" (% of the host's requests that named no version, stable and canary
        rows only, else None), "rps" (requests/s over the last minute), "p99_ms", "p99_minute_ms" (ms, None
        without requests), "error_rate" (0..1 of 5xx, None without requests)}]`` ordered by host, version and
        role.

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    selector = model_selector(model_name)
    if hosts is not None:  # less those where the name is a renamed model's (model_selector)
        selector["host"] = promql.AnyOf(h for h in hosts if h not in selector.get("host", ()))
    if by_host:
        return _traffic(selector, window_seconds, ("host",), client)
    return [{"host": "", **row} for row in _traffic(selector, window_seconds, (), client)]


def host_traffic_table(host_name: str, *, window_seconds: int, client: PrometheusClient | None = None) -> list[dict]:
    """The model × version table of one host: as ``traffic_table``, one row per model, version and role its
    front answered, ``"model"`` in place of ``"host"`` and shares of each model's requests that named no
    version. Five queries, whatever the number of models.

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    return _traffic({"host": host_name}, window_seconds, ("model",), client)


def fleet_traffic_by_host(window_seconds: int, *, client: PrometheusClient | None = None) -> dict[str, list[dict]]:
    """The fleet grouped by host: per host, one row per model, version and role its front answered, as in
    ``host_traffic_table`` (shares of each model's requests on that host that named no version). Five
    queries, whatever the number of hosts and models.

    Returns:
        ``{host: [row]}``, hosts in name order, each row as ``host_traffic_table``'s (with ``"host"`` too).

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    grouped: dict[str, list[dict]] = {}
    for row in _traffic({}, window_seconds, ("host", "model"), client):
        grouped.setdefault(row["host"], []).append(row)
    return grouped


def _traffic(selector: dict, window_seconds: int, groups: tuple[str, ...], client: PrometheusClient | None
             ) -> list[dict]:
    """Rows of ``promql.traffic_by_host`` by the labels ``groups`` (none: one sum), version and role; each row has
    each group label's value under its name, and its share of the requests that named no version within its
    group."""
    client = client or PrometheusClient()
    queries = promql.traffic_by_host(selector, window_seconds, by=", ".join((*groups, "version", "role")))
    try:
        results = client.gather({key: (lambda q=query: client.instant(q)) for key, query in queries.items()})
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    rows: dict[tuple[str, str, str], dict] = {}
    for key, samples in results.items():
        for sample in samples:
            labels = sample.labels
            first = tuple(labels.get(label, "") for label in groups)
            rows.setdefault((first, labels.get("version", ""), labels.get("role", "")), {})[key] = sample.value
    routed: dict[tuple, float] = {}
    for (first, _, role), row in rows.items():
        if role in ("stable", "canary"):
            routed[first] = routed.get(first, 0.0) + (row.get("requests") or 0.0)
    table = []
    for (first, version, role), row in rows.items():
        requests = row.get("requests") or 0.0
        answered = requests > 0
        table.append({
            **dict(zip(groups, first, strict=True)), "version": version, "role": role, "requests": round(requests),
            "share": 100 * requests / routed[first] if role in ("stable", "canary") and routed.get(first) else None,
            "rps": (row.get("requests_minute") or 0.0) / promql.LAST_MINUTE_SECONDS,
            "p99_ms": row.get("p99_ms") if answered else None,
            "p99_minute_ms": row.get("p99_minute_ms") if row.get("requests_minute") else None,
            "error_rate": (row.get("errors") or 0.0) / requests if answered else None,
        })
    table.sort(key=lambda r: (*(r[label] for label in groups), version_sort_key(r["version"]),
                              ROLE_ORDER.get(r["role"], 9)))
    return table
