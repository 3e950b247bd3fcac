"""Metrics for models, the fleet and hosts, read from Prometheus through the PromQL catalogue.

Every function issues a fixed number of queries, one per panel, grouped by label: the count
does not grow with the number of models, versions or hosts.
"""

import time

from django.db.models import Count, Q

from deployments.choices import CanaryState, DeploymentStatus, Residency, RolloutTrigger, TargetState
from deployments.heartbeats import residency_states
from deployments.models import Deployment
from deployments.served import hosts_lending_name, serving_now
from modelyard.errors import InvalidInput, ServiceUnavailable
from monitoring import promql
from monitoring.empty import empty_reasons
from monitoring.prometheus import PrometheusClient, PrometheusUnavailable, undefined_reason
from monitoring.readings import on_demand_measured
from registry.models import ModelVersion
from registry.registered_models import get_model

FLEET_WINDOW_SECONDS = promql.parse_range(promql.DEFAULT_PAGE_RANGE)  # as the model page and the API
LATENCY_KEYS = ("latency_mean_ms", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "queue_ms", "compute_ms")
SPARKLINE_SECONDS = 3600
SPARKLINE_STEP_SECONDS = 120
# The overview's columns; compute time is on the model page only. Pending requests there are the
# latest value ("now"); every other figure is the one the model page and the API give for the window.
OVERVIEW_METRICS = ("throughput", "latency_mean_ms", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms",
                    "error_rate", "queue_ms", "pending_requests")
OVERVIEW_LATEST = ("pending_requests",)


def _range_seconds(range_text: str) -> int:
    try:
        return promql.parse_range(range_text)
    except promql.InvalidRange as exc:
        raise InvalidInput(str(exc)) from exc


def _version_number(version: str):
    """Triton labels versions as strings; the API gives numbers where they are numbers."""
    return int(version) if version.isdigit() else version


# Why a figure of a version is null, when Prometheus gave no value at all (``undefined_reason`` gives
# the reason for a NaN or an Inf; ``_quiet_quantiles`` the one for a version that served nothing).
NO_SERIES = "no data: Prometheus has no series of it for this version in the range"
QUIET = "no data: the version answered no request in the range"


def _quiet_quantiles(values: dict) -> dict:
    """Drop latency figures for a version that served nothing: Triton's summary keeps its last
    quantiles after traffic stops, which would show a stale latency beside a zero throughput."""
    if values.get("throughput") == 0:
        return {**values, **{key: None for key in LATENCY_KEYS},
                "missing": {**dict.fromkeys(LATENCY_KEYS, QUIET), **values.get("missing", {})}}
    return values


def version_sort_key(version: str) -> tuple:
    """Sort key of a version label: numbers in numeric order first ("2" before "10"), then other labels by name."""
    return (0, int(version), "") if version.isdigit() else (1, 0, version)


def _metric_jobs(client: PrometheusClient, selector: dict, window: int, *, keys=None, latest=()) -> dict:
    """One instant query per metric of ``keys`` (default all); gauges and summaries read as the worst
    value during the window, except the keys in ``latest``, read as their latest value."""
    return {
        metric.key: (lambda q=metric.build(selector, window, over_window=metric.key not in latest):
                     client.instant(q))
        for metric in promql.MODEL_METRICS
        if keys is None or metric.key in keys
    }


def _by_model_version(results: dict) -> dict:
    """Fold {metric key: Samples} into {(model, version): {metric key: value, "missing": {metric key: why
    it is None}}}: a version whose every figure was NaN or Inf still has its row, each figure None with
    the reason."""
    rows: dict[tuple[str, str], dict] = {}

    def row(labels: dict) -> dict:
        key = (labels.get("model", ""), labels.get("version", ""))
        return rows.setdefault(key, {**{m.key: None for m in promql.MODEL_METRICS}, "missing": {}})

    for metric in promql.MODEL_METRICS:
        found = results.get(metric.key, [])
        for sample in found:
            row(sample.labels)[metric.key] = sample.value
        for labels, text in getattr(found, "undefined", ()):
            row(labels)["missing"][metric.key] = undefined_reason(text)
    for values in rows.values():
        values["missing"] = {m.key: values["missing"].get(m.key, NO_SERIES)
                             for m in promql.MODEL_METRICS if values[m.key] is None}
    return rows


def model_selector(model_name: str) -> dict:
    """The label selector of one registered model's series: ``{"model": name}``, less the hosts on which
    that runtime name belongs to a model renamed away from it (``deployments.served.hosts_lending_name``),
    so a model that took a renamed model's old name never shows or is judged by the other's traffic."""
    lent = hosts_lending_name(model_name, model_name)
    return {"model": model_name, "host": promql.NoneOf(lent)} if lent else {"model": model_name}


def model_metrics(model_name: str, range_text: str = "15m", *, client: PrometheusClient | None = None) -> dict:
    """Summarise one model's serving metrics per version over a range.

    Args:
        model_name: a registered model's name.
        range_text: the window, e.g. ``15m`` (see ``promql.parse_range``).
        client: the Prometheus client; defaults to one from settings.

    Returns:
        ``{"model", "range", "range_seconds", "versions": [{"version": str, "throughput":
        inferences/s, "latency_mean_ms", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms",
        "queue_ms", "compute_ms": ms, "error_rate": 0..1, "pending_requests": requests, "missing": {key:
        why that figure is None}}]}``, versions ascending; a figure is None, and named in ``missing`` with
        the reason, when Prometheus has no series of it, when the version answered no request in the range,
        or when PromQL computed no number (NaN or Inf: a ratio of two rates whose denominator was 0, as for
        a model whose every request failed or was held). Quantiles and pending requests are the worst seen
        during the range.

    Raises:
        NotFound: no such model.
        InvalidInput: malformed range.
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    model = get_model(model_name)
    seconds = _range_seconds(range_text)
    client = client or PrometheusClient()
    jobs = _metric_jobs(client, model_selector(model.name), seconds)
    try:
        rows = _by_model_version(client.gather(jobs))
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    versions = [
        {"version": _version_number(version), **_quiet_quantiles(values)} for (_, version), values in rows.items()
    ]
    versions.sort(key=lambda row: version_sort_key(str(row["version"])))
    return {"model": model.name, "range": range_text, "range_seconds": seconds, "versions": versions}


# How a marker names what a rollout did, by its status.
MARKER_WORDS = {
    DeploymentStatus.RUNNING: "rolling out", DeploymentStatus.PAUSED: "paused",
    DeploymentStatus.SUCCEEDED: "rolled out", DeploymentStatus.FAILED: "failed",
    DeploymentStatus.CANCELLED: "cancelled", DeploymentStatus.ROLLED_BACK: "rolled back",
}
# Target states a host only reaches once an agent started on it; pending and cancelled ones left it alone.
TOUCHED_STATES = tuple(state for state in TargetState.values if state not in (TargetState.PENDING,
                                                                             TargetState.CANCELLED))


def _hosts(n: int) -> str:
    return f"{n} host" if n == 1 else f"{n} hosts"


def marker_label(*, version: int, status: str, trigger: str, hosts: int, moved: int, failed: int,
                 touched: int) -> str:
    """What a deployment marker says: the version, what the rollout did and to how many hosts.

    Args:
        version: the version number rolled out.
        status: a ``DeploymentStatus`` value.
        trigger: a ``RolloutTrigger`` value.
        hosts: how many targets (hosts) the rollout has.
        moved: targets that served the version (ready, or unloaded since).
        failed: targets that failed to load it.
        touched: targets an agent started on (any state but pending and cancelled).

    Returns:
        e.g. "v2 rolled out to 2 hosts", "v3 failed on 1 of 2 hosts", "v4 cancelled before any host",
        "v1 rolled out to 1 host (rollback)".
    """
    word = MARKER_WORDS.get(status, status)
    if status == DeploymentStatus.SUCCEEDED:
        text = f"v{version} {word} to {_hosts(moved)}"
    elif status == DeploymentStatus.FAILED:
        text = f"v{version} {word} on {failed} of {_hosts(hosts)}"
    elif status == DeploymentStatus.CANCELLED:
        text = (f"v{version} {word} after {moved} of {_hosts(hosts)}" if touched
                else f"v{version} {word} before any host")
    elif status in (DeploymentStatus.RUNNING, DeploymentStatus.PAUSED):
        text = f"v{version} {word}: {moved} of {_hosts(hosts)}"
    else:
        text = f"v{version} {word}"
    return f"{text} (rollback)" if trigger == RolloutTrigger.ROLLBACK else text


def deployment_markers(model, *, since_seconds: int) -> list[dict]:
    """The model's deployments within the last ``since_seconds``, for the charts' markers; one SQL query.

    Returns:
        ``[{"id", "version", "status", "label" (``marker_label``), "hosts", "moved", "failed" (target
        counts), "touched" (bool: an agent started on at least one host), "start": s, "end": s |
        None}]``, oldest first, times in unix seconds; ``end`` is when the rollout finished, else
        None. A rollout cancelled before any host has ``touched`` False: the charts draw no line for it.
    """
    from django.utils import timezone

    since = timezone.now() - timezone.timedelta(seconds=since_seconds)
    deployments = (
        Deployment.objects.filter(model=model, created_at__gte=since)
        .select_related("version")
        .annotate(
            n_hosts=Count("targets"),
            n_moved=Count("targets", filter=Q(targets__state__in=(TargetState.READY, TargetState.UNLOADED))),
            n_failed=Count("targets", filter=Q(targets__state=TargetState.FAILED)),
            n_touched=Count("targets", filter=Q(targets__state__in=TOUCHED_STATES)),
        )
        .order_by("created_at")
    )
    markers = []
    for d in deployments:
        finished = d.finished_at is not None
        markers.append({
            "id": d.pk, "version": d.version.version, "status": d.status,
            "label": marker_label(version=d.version.version, status=d.status, trigger=d.trigger, hosts=d.n_hosts,
                                  moved=d.n_moved, failed=d.n_failed, touched=d.n_touched),
            "hosts": d.n_hosts, "moved": d.n_moved, "failed": d.n_failed, "touched": d.n_touched > 0,
            "start": d.created_at.timestamp(), "end": d.finished_at.timestamp() if finished else None,
        })
    return markers


UNDEFINED_POINTS = ("points left out: Prometheus computed NaN or Inf there (a ratio whose denominator was 0: no "
                    "request of that kind)")
def model_series(model_name: str, range_text: str = "15m", *, client: PrometheusClient | None = None) -> dict:
    """Time series of one model's metrics per version, for charts, with deployment markers.

    Returns:
        ``{"model", "range", "range_seconds", "step": seconds, "series": {key: [{"version": str, "points":
        [[unix seconds, value], ...], "undefined_points": count, "missing": str | None}]}, "empty": {key: why
        it has no point}, "units": {key: unit}, "markers": [...]}`` for every key of ``promql.MODEL_METRICS``;
        at most ``promql.MAX_POINTS`` points per series. A point where PromQL computed no number (NaN or Inf)
        is left out: counted in ``undefined_points``, and ``missing`` says why (None when none was left out).
        ``empty`` names each metric without a single point and why (``monitoring.empty``).

    Raises:
        NotFound, InvalidInput, ServiceUnavailable: as ``model_metrics``.
    """
    model = get_model(model_name)
    seconds = _range_seconds(range_text)
    step = promql.step_for(seconds)
    client = client or PrometheusClient()
    series: dict[str, list] = {}
    selector = model_selector(model.name)
    try:
        results = client.gather({
            m.key: (lambda q=m.build(selector, step): client.range(q, seconds=seconds, step=step))
            for m in promql.MODEL_METRICS
        })
        for key, found in results.items():
            rows = [{"version": s.labels.get("version", ""), "points": [[t, v] for t, v in s.points],
                     "undefined_points": s.undefined,
                     "missing": UNDEFINED_POINTS if s.undefined else None}
                    for s in found]
            series[key] = sorted(rows, key=lambda r: version_sort_key(r["version"]))
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    return {
        "model": model.name, "range": range_text, "range_seconds": seconds, "step": step, "series": series,
        "empty": empty_reasons(series), "units": {m.key: m.unit for m in promql.MODEL_METRICS},
        "markers": deployment_markers(model, since_seconds=seconds),
    }


def deployed_versions() -> list[dict]:
    """The (model, version, hosts) triples that the registry believes are being served.

    A host serves the version of its most recent ready target for each model, and beside an active canary the
    stable version it kept (the target's ``previous_version``); a version deployed on demand is registered
    there, loaded only while its host's gateway holds it resident.

    Returns:
        ``[{"model": str, "version": str, "hosts": [str], "on_demand": [{"host", "resident": bool | None}]}]``
        sorted by model and version; ``on_demand`` names the hosts where the version is registered on demand,
        whether its gateway last reported it resident (None: not reported). One SQL query more when any is,
        and one when an active canary serves somewhere.
    """
    grouped: dict[tuple[str, str], set[str]] = {}
    # A few columns of each target: on a fleet of hundreds, decoding every JSON field of the targets,
    # hosts and versions cost more than Prometheus's answers (bench/overview.py).
    targets = serving_now(only=("deployment__version__version", "deployment__residency",
                                "deployment__canary_state", "previous_version", "served_name"))
    stable_ids = {t.previous_version_id for t in targets
                  if t.deployment.canary_state == CanaryState.ACTIVE and t.previous_version_id}
    stable = dict(ModelVersion.objects.filter(pk__in=stable_ids).values_list("pk", "version")) if stable_ids else {}
    on_demand = [t for t in targets if t.deployment.residency == Residency.ON_DEMAND]
    states = residency_states({t.host.name for t in on_demand}) if on_demand else {}
    held: dict[tuple[str, str], list] = {}
    for target in targets:
        key = (target.deployment.model.name, str(target.deployment.version.version))
        grouped.setdefault(key, set()).add(target.host.name)
        if target.deployment.canary_state == CanaryState.ACTIVE and target.previous_version_id in stable:
            grouped.setdefault((key[0], str(stable[target.previous_version_id])), set()).add(target.host.name)
        if target.deployment.residency == Residency.ON_DEMAND:
            state = states.get(target.host.name, {}).get(target.runtime_name)
            held.setdefault(key, []).append({"host": target.host.name,
                                             "resident": None if state is None else state == "resident"})
    return [
        {"model": model, "version": version, "hosts": sorted(hosts),
         "on_demand": sorted(held.get((model, version), []), key=lambda h: h["host"])}
        for (model, version), hosts in sorted(grouped.items(), key=lambda i: (i[0][0], version_sort_key(i[0][1])))
    ]


def fleet_overview(
    *, window_seconds: int = FLEET_WINDOW_SECONDS, sparkline_seconds: int = SPARKLINE_SECONDS,
    sparkline_step: int = SPARKLINE_STEP_SECONDS, client: PrometheusClient | None = None,
) -> dict:
    """Every deployed model version with its metrics over a window and a throughput sparkline.

    Metrics cover the last ``window_seconds`` (default 15 minutes, the model page's and the API's
    default range) and are the very queries ``model_metrics`` sends for that window, so the
    overview, the model page and the API agree; only pending requests are the latest value. The
    sparkline covers the last
    ``sparkline_seconds`` at one point every ``sparkline_step`` seconds (default: an hour, a
    point every two minutes). Only the overview's columns (``OVERVIEW_METRICS``) are queried.
    Versions Prometheus reports that the registry does not know of are
    included with ``tracked`` False; ``registered`` says whether the registry knows the version
    (one replaced moments ago still reports for a while) or not at all.

    Returns:
        ``{"window_seconds", "rows": [{"model", "version", "hosts", "on_demand" (as ``deployed_versions``),
        "tracked", <metric keys>, "refused": {outcome: requests} (a version on demand: the 503s its gateways
        answered for it over the window, ``promql.on_demand_refused``; one query more when any is on demand),
        "sparkline": [[unix seconds, inferences/s]]}], "sparkline_span": [start, end] (unix seconds),
        "prometheus_error": str}``; with Prometheus down the rows carry
        no metrics and ``prometheus_error`` says why.
    """
    client = client or PrometheusClient()
    rows = {(d["model"], d["version"]): {**d, "tracked": True, "registered": True} for d in deployed_versions()}
    error = ""
    metrics: dict = {}
    sparklines: dict = {}
    refused: dict[str, dict[str, int]] = {}
    try:
        jobs = _metric_jobs(client, {}, window_seconds, keys=OVERVIEW_METRICS, latest=OVERVIEW_LATEST)
        spark_query = promql.throughput({}, sparkline_step)
        jobs["sparkline"] = lambda: client.range(spark_query, seconds=sparkline_seconds, step=sparkline_step)
        if any(row["on_demand"] for row in rows.values()):
            jobs["refused"] = lambda: client.instant(promql.on_demand_refused(window_seconds))
        results = client.gather(jobs)
        metrics = _by_model_version(results)
        for s in results["sparkline"]:
            sparklines[(s.labels.get("model", ""), s.labels.get("version", ""))] = [[t, v] for t, v in s.points]
        for sample in results.get("refused", []):
            if count := round(sample.value):
                refused.setdefault(sample.labels.get("model", ""), {})[sample.labels.get("outcome", "")] = count
    except PrometheusUnavailable as exc:
        error = str(exc)
    extra = [key for key in metrics if key not in rows]
    registered = set()
    if extra:
        registered = {
            (name, str(number)) for name, number in ModelVersion.objects.filter(
                model__name__in={model for model, _ in extra}).values_list("model__name", "version")
        }
    for key in extra:
        rows[key] = {"model": key[0], "version": key[1], "hosts": [], "on_demand": [], "tracked": False,
                     "registered": key in registered}
    empty = {m.key: None for m in promql.MODEL_METRICS}
    result = [
        {**row, **empty, **_quiet_quantiles(metrics.get(key, {})), "sparkline": sparklines.get(key, []),
         "refused": refused.get(key[0], {}) if row["on_demand"] else {}}
        for key, row in rows.items()
    ]
    result.sort(key=lambda r: (r["model"], version_sort_key(r["version"])))
    end = time.time()
    return {"window_seconds": window_seconds, "rows": result, "prometheus_error": error,
            "sparkline_span": [end - sparkline_seconds, end]}


GATE_METRICS = ("latency_p95_ms", "error_rate")


def version_gate_metrics(
    model_name: str, *, window_seconds: int, client: PrometheusClient | None = None
) -> dict[str, dict]:
    """What promotion gates judge, per version of one model, over the last ``window_seconds``.

    Three queries, whatever the number of versions: requests answered
    (``promql.requests_in_window``), the worst p95 latency seen (``promql.latency_quantile_ms``
    over the window) and the error rate (``promql.error_rate``).

    Returns:
        ``{version (str, as Prometheus labels it): {"requests": count, "latency_p95_ms": ms,
        "error_rate": 0..1}}``; a value is None when Prometheus has no data for it, and the
        latency is None for a version that answered no request in the window (Triton's summary
        keeps its last quantiles after traffic stops). Versions without series are absent.

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    client = client or PrometheusClient()
    selector = model_selector(model_name)
    jobs = {"requests": lambda: client.instant(promql.requests_in_window(selector, window_seconds))}
    jobs.update(_metric_jobs(client, selector, window_seconds, keys=GATE_METRICS))
    try:
        results = client.gather(jobs)
    except PrometheusUnavailable as exc:
        raise ServiceUnavailable(str(exc)) from exc
    versions: dict[str, dict] = {}
    for key, samples in results.items():
        for sample in samples:
            empty = {"requests": None, **dict.fromkeys(GATE_METRICS)}
            row = versions.setdefault(sample.labels.get("version", ""), empty)
            row[key] = sample.value
    for row in versions.values():
        if not row["requests"]:
            row["latency_p95_ms"] = None
    return versions


def on_demand_table(model_name: str, *, window_seconds: int, client: PrometheusClient | None = None) -> dict[str, dict]:
    """What each host's gateway measured of ``model_name`` on demand over the window, by host
    (``readings.on_demand_measured``; six queries, whatever the number of hosts): a host without on-demand
    series is left out.

    Raises:
        ServiceUnavailable: Prometheus unreachable, slow or refusing.
    """
    return on_demand_measured(model_selector(model_name), by="host", window_seconds=window_seconds, client=client)
