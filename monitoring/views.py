"""Monitoring pages and fragments: the fleet overview and the model metrics panel."""

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from accounts.access import Principal
from deployments.choices import CanaryState
from deployments.hosts import get_host
from deployments.models import ServingHost
from deployments.served import get_deployment, serving_now
from deployments.serving import model_serving as serving_panel
from modelyard.errors import ServiceUnavailable
from modelyard.views import found_or_404
from monitoring import promql, readings, services, traffic
from monitoring.templatetags.monitoring_tags import number, percent, sparkline_peak, sparkline_points
from registry.access import visible_model_names
from registry.models import RegisteredModel
from registry.pages import model_or_404

PANEL_RANGE = promql.DEFAULT_PAGE_RANGE
OVERVIEW_PAGE_SIZE = 50
DISPLAY_UNITS = {"error_rate": "% of requests", "pending_requests": "now"}
SORT_KEYS = ("model", *services.OVERVIEW_METRICS)


def metrics_panel_context(model: RegisteredModel, range_text: str = PANEL_RANGE) -> dict:
    """Context of the model metrics fragment: per-version summary over ``range_text`` and host memory.

    Never raises for Prometheus trouble: ``prometheus_error`` carries the notice to show instead.
    """
    host_names = list(
        ServingHost.objects.filter(targets__deployment__model=model).distinct().order_by("name")
        .values_list("name", flat=True)
    )
    context = {"model": model, "range": range_text, "summary": None, "hosts": [], "prometheus_error": ""}
    try:
        context["summary"] = services.model_metrics(model.name, range_text)
        context["hosts"] = readings.host_memory(host_names)
    except ServiceUnavailable as exc:
        context["prometheus_error"] = exc.message
    return context


@login_required
def model_metrics_panel(request, name: str):
    """The htmx-refreshed metrics fragment of the model page (``?range=`` one of the page ranges;
    ``?versions=3,4`` keeps those versions' rows, in that order, as the comparison page shows them)."""
    model = model_or_404(request, name)
    context = metrics_panel_context(model, page_range(request))
    wanted = [v for v in request.GET.get("versions", "").split(",") if v.strip().isdigit()]
    if wanted and context["summary"] is not None:
        rows = {str(row["version"]): row for row in context["summary"]["versions"]}
        context["summary"]["versions"] = [rows.get(v.strip()) or {"version": v.strip()} for v in wanted]
        context["hosts"] = []
    return render(request, "monitoring/partials/model_metrics.html", context)


def configured_routes(model: RegisteredModel) -> dict[str, dict]:
    """The route each host that serves ``model`` is set to hold for it, in the shape a host's agent reports
    (``{"stable", "canary", "percent", "shadow", "shadow_percent"}``, for ``route_share``); from the rollouts
    the registry holds (``deployments.serving.model_serving``). A host that serves no version is left out."""
    routes: dict[str, dict] = {}
    for row in serving_panel(model)["hosts"]:
        traffic, serving = getattr(row, "traffic", None), getattr(row, "serving", None)
        if traffic:
            shadow = float(traffic.get("shadow_percent") or 0)
            routes[row.host.name] = {"stable": traffic.get("stable"), "canary": traffic["version"],
                                     "percent": float(traffic.get("percent") or 0),
                                     "shadow": traffic["version"] if shadow else None, "shadow_percent": shadow}
        elif serving:
            routes[row.host.name] = {"stable": serving.version, "canary": None}
    return routes


def carries_something(row: dict) -> bool:
    """Whether a traffic row says anything: a request over the window or the last minute, or a share its route
    is set to give it (``configured``). The gateway makes every role's series of a routed version at 0 (its
    pinned ones too), so without this each model would show a row of zeros per role nobody used."""
    return bool(row["requests"] or row["rps"] or row.get("configured"))


def _traffic_page(request, group: str, read, shape) -> HttpResponse:
    """Render the traffic table (``monitoring/partials/model_traffic.html``) of ``read(window_seconds)``'s rows
    by ``group`` ("host" or "model"), each passed through ``shape(row)`` (None drops it), less those that carry
    nothing (``carries_something``); Prometheus trouble becomes the page's notice."""
    range_text = page_range(request)
    context = {"range": range_text, "rows": [], "prometheus_error": "", "group": group}
    try:
        rows = read(promql.parse_range(range_text))
    except ServiceUnavailable as exc:
        context["prometheus_error"] = exc.message
    else:
        context["rows"] = _shaped(rows, group, shape)
    return render(request, "monitoring/partials/model_traffic.html", context)


def _shaped(rows: list[dict], group: str, shape) -> list[dict]:
    """``rows``, each with its ``group`` label's value under "group", passed through ``shape(row)`` (None drops
    it), less those that carry nothing (``carries_something``)."""
    return [shaped for row in rows if (shaped := shape({**row, "group": row[group]})) is not None
            and carries_something(shaped)]


def _model_rows(visible: set[str] | None, routes: dict):
    """The ``shape`` of a host's model rows: only the models the user may see (``visible``; None: all), each with
    the share the host's ``routes`` (as its heartbeat reports them) set (``configured``)."""
    def shape(row: dict) -> dict | None:
        if visible is not None and row["model"] not in visible:
            return None
        return {**row, "configured": route_share(routes.get(row["model"]), row["version"], row["role"])}

    return shape


@login_required
def model_traffic(request, name: str):
    """The host × version table of the model page (htmx, polled; ``?range=`` one of the page ranges): per host,
    a row for each version its front answered for the model, by role, with the share of the requests that
    named no version beside the share its route is set to, requests/s and p99 over the last minute, p99 and
    error rate over the range (``monitoring.traffic.traffic_table``)."""
    model = model_or_404(request, name)
    routes = {}

    def read(window: int) -> list[dict]:
        rows = traffic.traffic_table(model.name, window_seconds=window)
        routes.update(configured_routes(model))
        return rows

    return _traffic_page(request, "host", read, lambda row: {**row, "configured": route_share(
        routes[row["host"]], row["version"], row["role"]) if row["host"] in routes else None})


@login_required
def host_traffic(request, name: str):
    """The model × version table of a host page (htmx, polled; ``?range=``): per model the host's front answered
    and the user may see (their teams' models; administrators every series), a row per version and role, as on
    the model page (``monitoring.traffic.host_traffic_table``)."""
    host = found_or_404(get_host, name)
    visible = visible_model_names(Principal.of(request))
    routes = ((host.heartbeat or {}).get("gateway") or {}).get("routes") or {}
    return _traffic_page(request, "model", lambda window: traffic.host_traffic_table(host.name, window_seconds=window),
                         _model_rows(visible, routes))


@login_required
def overview_by_host(request):
    """The fleet grouped by host (``?range=``, ``?host=``): per host whose front answered, the model × version
    table of its host page, measured there (``monitoring.traffic.fleet_traffic_by_host``: five queries whatever
    the number of hosts), for the models the user may see, each share beside what the host's route sets."""
    range_text, only = page_range(request), request.GET.get("host", "").strip()
    visible = visible_model_names(Principal.of(request))
    routes = {name: ((heartbeat or {}).get("gateway") or {}).get("routes") or {}
              for name, heartbeat in ServingHost.objects.values_list("name", "heartbeat")}
    context = {"range": range_text, "ranges": promql.PAGE_RANGES, "groups": [], "prometheus_error": "",
               "host": only, "hosts": sorted(routes)}
    try:
        grouped = traffic.fleet_traffic_by_host(promql.parse_range(range_text))
    except ServiceUnavailable as exc:
        context["prometheus_error"] = exc.message
        grouped = {}
    for host, rows in grouped.items():
        shown = _shaped(rows, "model", _model_rows(visible, routes.get(host, {})))
        if shown and (not only or host == only):
            context["groups"].append({"host": host, "rows": shown, "known": host in routes})
    return render(request, "monitoring/overview_by_host.html", context)


def route_share(route: dict | None, version: str, role: str) -> float | None:
    """The share (%) of a model's requests that name no version a gateway route gives ``version`` as ``role``
    (``{"stable", "canary", "percent", "shadow", "shadow_percent"}`` as the host's agent reports it; None: the
    model has no route, so the version that answers them takes all); None where the route gives it none."""
    if not route:
        return 100.0 if role == "stable" else None
    percent = float(route.get("percent") or 0)
    given = {("stable", str(route.get("stable"))): 100 - percent if route.get("canary") is not None else 100.0,
             ("canary", str(route.get("canary"))): percent,
             ("shadow", str(route.get("shadow"))): float(route.get("shadow_percent") or 0)}
    return given.get((role, version))


@login_required
def rollout_canary_traffic(request, pk: int):
    """A canary rollout's traffic beside its stable version's (htmx fragment of the rollout page): on the hosts
    it reached, over its lifetime (from its start until it was promoted or rolled back, or now while it is active;
    1 minute at least), per version and role,
    the share of the requests that named no version, requests, p99 and 5xx rate, measured at the hosts' fronts."""
    deployment = get_deployment(pk)
    model = model_or_404(request, deployment.model.name)
    # A canary rollout finishes (succeeded) once every host loaded it, while its canary stays active: the
    # canary's lifetime runs until it is promoted or rolled back (the deployment's last event), or now.
    end = timezone.now()
    if deployment.canary_state != CanaryState.ACTIVE:
        end = deployment.events.order_by("-created_at").values_list("created_at", flat=True).first() or end
    lifetime = int(min(max((end - deployment.created_at).total_seconds(), promql.MIN_RANGE_SECONDS),
                       promql.MAX_RANGE_SECONDS))
    context = {"deployment": deployment, "rows": [], "prometheus_error": "", "lifetime_seconds": lifetime}
    try:
        rows = traffic.traffic_table(model.name, window_seconds=lifetime, by_host=False,
                                      hosts=[t.host.name for t in deployment.targets.all()])
    except ServiceUnavailable as exc:
        context["prometheus_error"] = exc.message
    else:
        context["rows"] = [row for row in rows if row["role"] in ("stable", "canary")]
    return render(request, "monitoring/partials/canary_traffic.html", context)


def page_range(request) -> str:
    """The ``?range=`` of a metrics page if it is one the pages offer, else the default (15m)."""
    return promql.page_range(request.GET.get("range"))


def _overview_context(request) -> dict:
    query = request.GET.get("q", "").strip()
    host = request.GET.get("host", "").strip()
    sort = request.GET.get("sort", "model")
    sort = sort if sort in SORT_KEYS else "model"
    descending = request.GET.get("order", "desc" if sort != "model" else "asc") == "desc"
    range_text = page_range(request)
    overview = services.fleet_overview(window_seconds=promql.parse_range(range_text))
    principal = Principal.of(request)
    # Rows of other teams' models stay hidden; so do series of models the registry does not know
    # (their names could be anyone's), except for administrators.
    visible = visible_model_names(principal)
    overview["rows"] = [r for r in overview["rows"] if visible is None or r["model"] in visible]
    rows = [
        r for r in overview["rows"]
        if (not query or query.lower() in r["model"]) and (not host or host in r["hosts"])
    ]
    present = [r for r in rows if r[sort] is not None]
    missing = [r for r in rows if r[sort] is None]
    present.sort(key=lambda r: r[sort], reverse=descending)
    page = Paginator(present + missing, OVERVIEW_PAGE_SIZE).get_page(request.GET.get("page"))
    return {
        "page": page,
        "rows": [_display_row(r, overview["sparkline_span"]) for r in page.object_list],
        "matching": len(rows),
        "total": len(overview["rows"]),
        "range": range_text, "ranges": promql.PAGE_RANGES,
        "prometheus_error": overview["prometheus_error"],
        "query": query, "host": host, "sort": sort, "order": "desc" if descending else "asc",
        "hosts": ServingHost.objects.order_by("name").values_list("name", flat=True),
        "columns": [(key, promql.METRICS_BY_KEY[key].title, DISPLAY_UNITS.get(key, promql.METRICS_BY_KEY[key].unit))
                    for key in SORT_KEYS[1:]],
    }


# (metric key, formatter, CSS class) per numeric column, in SORT_KEYS order after "model".
COLUMN_FORMATS = (
    ("throughput", lambda v: number(v, 2), "num throughput"),
    ("latency_mean_ms", lambda v: number(v, 2), "num latency-mean"),
    ("latency_p50_ms", lambda v: number(v, 2), "num"),
    ("latency_p95_ms", lambda v: number(v, 2), "num"),
    ("latency_p99_ms", lambda v: number(v, 2), "num"),
    ("error_rate", lambda v: percent(v, 2), "num"),
    ("queue_ms", lambda v: number(v, 3), "num"),
    ("pending_requests", lambda v: number(v, 0), "num"),
)


def residency_words(on_demand: list[dict]) -> str:
    """How the overview names a version registered on demand (``services.deployed_versions``'s ``on_demand``):
    "on demand · resident on gpu-0 · not resident now on gpu-1"; "" for one loaded while it serves."""
    if not on_demand:
        return ""
    parts = ["on demand"]
    for words, resident in (("resident on", True), ("not resident now on", False), ("not reported yet by", None)):
        hosts = [h["host"] for h in on_demand if h["resident"] is resident]
        if hosts:
            parts.append(f"{words} {', '.join(hosts)}")
    return " · ".join(parts)


def refusal_words(refused: dict[str, int]) -> str:
    """Why an on-demand version's error rate is what it is: "503s of on-demand loads: load_failed 3, timeout 1"
    (``services.fleet_overview``'s ``refused``, by outcome), "" without any."""
    if not refused:
        return ""
    return "503s of on-demand loads: " + ", ".join(f"{outcome} {count}" for outcome, count in sorted(refused.items()))


def _display_row(row: dict, span=None) -> dict:
    """Format one overview row in Python: hundreds of rows render far faster than with per-cell filters."""
    hints = {"error_rate": refusal_words(row.get("refused") or {})}
    return {
        **row,
        "residency": residency_words(row.get("on_demand") or []),
        "url": reverse("registry:model-detail", args=[row["model"]]) if row.get("registered") else "",
        "cells": [(css, fmt(row[key]), hints.get(key, "")) for key, fmt, css in COLUMN_FORMATS],
        "spark": sparkline_points(row["sparkline"], "120x28", span),
        "spark_peak": number(sparkline_peak(row["sparkline"]), 2),
    }


def on_demand_hosts() -> list[dict]:
    """Per host whose gateway holds models on demand, from its last heartbeat: ``{"host", "registered",
    "resident" (models), "budget_bytes", "resident_bytes" (None without a budget)}``, by host name."""
    rows = []
    for name, heartbeat in ServingHost.objects.order_by("name").values_list("name", "heartbeat"):
        residency = ((heartbeat or {}).get("gateway") or {}).get("residency") or {}
        models = residency.get("models") or {}
        if models:
            budget = residency.get("budget") or {}
            rows.append({"host": name, "registered": len(models),
                         "resident": sum(1 for m in models.values() if m.get("state") == "resident"),
                         "budget_bytes": budget.get("budget_bytes"), "resident_bytes": budget.get("resident_bytes")})
    return rows


@login_required
def overview(request):
    """The fleet overview: every deployed model version with its live metrics and a sparkline.

    Query parameters: ``range`` (the metrics' window, one of ``promql.PAGE_RANGES``; default 15m,
    as on the model page), ``q`` (model name substring), ``host``, ``sort`` (a column key),
    ``order`` (asc|desc) and ``page`` (50 rows a page, sorted across all pages). The table
    refreshes itself every 15 s through htmx. Hosts that hold models on demand get a line each: registered
    against resident models and the memory budget (``on_demand_hosts``).
    """
    return render(request, "monitoring/overview.html", {**_overview_context(request), "on_demand": on_demand_hosts()})


@login_required
def overview_table(request):
    """The overview's table alone, for the htmx refresh."""
    return render(request, "monitoring/partials/overview_table.html", _overview_context(request))


@login_required
def model_on_demand(request, name: str):
    """The on-demand panel of the model page (htmx, polled; ``?range=``): per host where the model is registered
    on demand, its state as the host's gateway last reported it (resident, cold or evicting; pinned; requests
    held), and from Prometheus over the range the hit rate, the cold starts with their p50 and p99 wait, the
    requests answered 503 by reason and the evictions by reason (``monitoring.services.on_demand_table``).
    Empty for a model no host holds on demand."""
    model = model_or_404(request, name)
    hosts = []
    for target in serving_now(deployment__model=model):
        held = (((target.host.heartbeat or {}).get("gateway") or {}).get("residency") or {}).get("models") or {}
        if target.runtime_name in held:
            hosts.append({"host": target.host.name, **held[target.runtime_name]})
    context = {"model": model, "range": request.GET.get("range") or PANEL_RANGE, "hosts": hosts,
               "prometheus_error": ""}
    if hosts:
        try:
            measured = services.on_demand_table(model.name, window_seconds=promql.parse_range(context["range"]))
        except ServiceUnavailable as exc:
            context["prometheus_error"] = exc.message
        else:
            for row in hosts:
                row["measured"] = measured.get(row["host"])
    return render(request, "monitoring/partials/on_demand.html", context)
