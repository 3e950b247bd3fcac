"""Deployments pages: the serving hosts list, a host's page, the rollout page with its controls, and a model's
deployment, serving, capture and Try it panels (a version's profile and replay pages: ``deployments.job_pages``)."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from accounts.access import Action, Principal, check, require
from deployments import canaries, lifecycle, rollouts
from deployments.capture import capture_panel
from deployments.choices import ACTIVE_DEPLOYMENT_STATUSES, Residency, TargetState
from deployments.forms import CaptureForm, RolloutForm, ServingHostForm, TryItForm
from deployments.heartbeats import budget_problem, on_demand_names, residency_report
from deployments.hosts import delete_host, get_host, register_host
from deployments.inference import try_inference
from deployments.lifecycle import reload_model, serving_target, unload_model
from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.served import get_deployment, served_owners, serving_now, visible_report_rows
from deployments.services import BreakingSignature, start_deployment
from deployments.serving import model_serving as serving_panel
from deployments.serving import rollout_host_rows
from modelyard.errors import DomainError, ServiceUnavailable
from modelyard.views import found_or_404
from monitoring import promql
from monitoring import readings as monitoring
from registry.access import visible_models
from registry.capture import set_capture
from registry.pages import forbidden_unless, model_or_404


@login_required
def host_list(request):
    """Every serving host with its runtime and endpoints."""
    return render(request, "deployments/host_list.html", {"hosts": ServingHost.objects.order_by("name")})


@login_required
def host_create(request):
    """Register a serving host (administrators only): Prometheus discovers and scrapes it from then on."""
    forbidden_unless(request, Action.ADMIN)
    form = ServingHostForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            host = register_host(
                name=data["name"], runtime=data["runtime"], inference_url=data["inference_url"],
                metrics_url=data["metrics_url"],
                config_overrides={"parameters": data["parameters"]} if data["parameters"] else {},
                production=data.get("production", False), load_deadline=data.get("load_deadline"),
                unload_deadline=data.get("unload_deadline"), actor=request.user,
            )
        except DomainError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Serving host {host.name} registered; its agent consumes {host.queue}.")
            return redirect("deployments:host-detail", name=host.name)
    return render(request, "deployments/host_form.html", {"form": form})


def _loaded_models(host: ServingHost, visible) -> list[dict]:
    """The versions of the ``visible`` models (a RegisteredModel queryset) this host serves per the registry,
    with the footprint measured at their load (``_footprint``) and whether they are registered on demand."""
    rows = []
    for target in serving_now(host=host, deployment__model__in=visible):
        (gpu, gpu_why), (cpu, cpu_why) = _footprint(target, "gpu"), _footprint(target, "cpu")
        rows.append({
            "model": target.deployment.model.name,
            "runtime_name": target.runtime_name,
            "version": target.deployment.version.version,
            "on_demand": target.deployment.residency == Residency.ON_DEMAND,
            "gpu_bytes": gpu, "gpu_unmeasured": gpu_why, "cpu_bytes": cpu, "cpu_unmeasured": cpu_why,
            "since": target.updated_at,
        })
    return rows


def _footprint(target: DeploymentTarget, kind: str) -> tuple[int | None, str]:
    """``(bytes, "")``: the ``kind`` ("gpu" or "cpu") memory the server grew by while the target's version
    loaded; ``(None, why it was not measured)`` when it was not. A growth of 0 is no measurement: the agent
    reads a gauge that did not move (not refreshed yet) or fell (memory freed meanwhile) as 0, and placement
    counts it as unknown too (``placement.measured_footprint``)."""
    details = target.details or {}
    value = (details.get("footprint_bytes") or {}).get(kind)
    if isinstance(value, int | float) and value > 0:
        return int(value), ""
    if details.get("resident") is False:
        return None, "registered on demand: its rollout staged it and loaded nothing to measure"
    if value == 0:
        return None, ("the server's memory gauge did not grow while it loaded (not refreshed yet, or memory freed "
                      "meanwhile)")
    if not target.host.metrics_url:
        return None, "the host has no metrics URL to read the server's memory from"
    return None, f"the server's {kind.upper()} memory gauge could not be read around the load"


ON_DEMAND_RANGE = "15m"  # as the host page's traffic table


def _on_demand_section(host: ServingHost, loaded: list[dict], principal: Principal) -> dict:
    """The host page's on-demand section: the models registered on demand here (``loaded``'s on-demand rows,
    and those the gateway reports that the caller may read) with their state as the last heartbeat reported
    it (``heartbeats.residency_report``), the memory budget, and what the gateway measured over the last
    15 minutes per model (``readings.on_demand_measured``: hits, cold starts with their p50 and p99 waits,
    evictions by reason; ``prometheus_error`` when Prometheus cannot say)."""
    report = residency_report(host, lambda names: set(visible_models(principal).filter(name__in=names)
                                                      .values_list("name", flat=True)))
    reported = {entry["model"]: entry for entry in report["models"]}
    rows = [{**row, "state": None, **{key: value for key, value in reported.pop(row["runtime_name"], {}).items()
                                      if key != "model"}} for row in loaded if row["on_demand"]]
    rows += [{**entry, "runtime_name": entry["model"], "version": None} for entry in reported.values()]
    section = {"rows": rows, "budget": report["budget"], "range": ON_DEMAND_RANGE, "prometheus_error": "",
               "resident": sum(1 for row in rows if row["state"] == "resident")}
    if rows:
        try:
            measured = monitoring.on_demand_measured({"host": host.name}, by="model",
                                                     window_seconds=promql.parse_range(ON_DEMAND_RANGE))
        except ServiceUnavailable as exc:
            section["prometheus_error"] = exc.message
        else:
            for row in rows:
                row["measured"] = measured.get(row["runtime_name"])
    return section


def _unloaded_models(host: ServingHost, served: set[str], visible) -> list[dict]:
    """The ``visible`` models unloaded from this host (by hand or for idleness) that it does not serve again since,
    nor holds on demand (``served`` names both)."""
    latest: dict[str, DeploymentTarget] = {}
    for target in (DeploymentTarget.objects.filter(host=host, state=TargetState.UNLOADED,
                                                   deployment__model__in=visible)
                   .select_related("deployment__model", "deployment__version")
                   .order_by("deployment__created_at", "deployment_id")):
        latest[target.deployment.model.name] = target
    return [{"model": name, "version": t.deployment.version.version, "since": t.updated_at}
            for name, t in sorted(latest.items()) if name not in served]


@login_required
def host_detail(request, name: str):
    """A host's GPUs (memory and utilisation per GPU), CPU memory, loaded models and headroom, and the models
    registered on demand there (``_on_demand_section``), apart from those loaded while they serve."""
    host = found_or_404(get_host, name)
    visible = visible_models(Principal.of(request))
    principal = Principal.of(request)
    loaded = _loaded_models(host, visible)
    unloaded = _unloaded_models(host, {m["model"] for m in loaded} | on_demand_names(host), visible)
    by_name = {m.name: m for m in visible.filter(name__in=[row["model"] for row in loaded + unloaded])}
    for row in loaded + unloaded:
        row["may_deploy"] = check(principal, Action.DEPLOY, model=by_name[row["model"]], hosts=[host]) is None
    models = [row for row in loaded if not row["on_demand"]]
    on_demand = _on_demand_section(host, loaded, principal)
    owners = served_owners([host.pk])
    context = {"host": host, "models": models, "unloaded": unloaded, "on_demand": on_demand,
               "repository": visible_report_rows(principal, host.pk, (host.heartbeat or {}).get("models") or [],
                                                 owners),
               "stuck": visible_report_rows(principal, host.pk, host.stuck_versions(), owners),
               "gpus": [], "cpu": None, "prometheus_error": "",
               "headroom": None, "may_delete": check(principal, Action.ADMIN) is None,
               "budget_problem": budget_problem(host)}
    try:
        found = monitoring.host_metrics([host.name])[host.name]
        context["gpus"], context["cpu"] = found["gpus"], found["cpu"]
    except ServiceUnavailable as exc:
        context["prometheus_error"] = exc.message
    free = [g["memory_total"] - g["memory_used"] for g in context["gpus"]
            if g["memory_total"] is not None and g["memory_used"] is not None]
    if free:
        context["headroom"] = {"total_free": sum(free), "largest_free": max(free)}
    return render(request, "deployments/host_detail.html", context)


@login_required
def host_delete(request, name: str):
    """Delete a serving host (administrators only): GET asks for confirmation, POST deletes.

    A refusal (a deployment in progress there, a model it still serves) goes back to the host's page
    as a message, and the host stays.
    """
    forbidden_unless(request, Action.ADMIN)
    host = found_or_404(get_host, name)
    if request.method == "POST":
        try:
            delete_host(name=host.name, actor=request.user)
        except DomainError as exc:
            messages.error(request, exc.message)
            return redirect("deployments:host-detail", name=host.name)
        messages.success(request, f"Serving host {host.name} deleted; its agent's queue {host.queue} is no longer "
                                  "served and Prometheus stops scraping it.")
        return redirect("deployments:host-list")
    return render(request, "deployments/host_confirm_delete.html", {"host": host})


ROLLOUT_ACTIONS = {
    "pause": (rollouts.pause_rollout, "Rollout paused: hosts in flight finish, no further batch starts."),
    "resume": (rollouts.resume_rollout, "Rollout resumed with its next batch."),
    "cancel": (rollouts.cancel_rollout, "Rollout cancelled: hosts not yet moved keep what they serve."),
    "rollback": (rollouts.rollback_rollout, "Rolling back: moved hosts return to their previous version."),
    "promote": (canaries.promote_canary, "Promoting the canary: each host sends every request to it, then unloads "
                                         "its stable version."),
}
# Actions that cannot be undone ask for confirmation first.
CONFIRMED_ACTIONS = {"cancel", "rollback", "promote"}


def _rollout_context(request, pk: int) -> dict:
    deployment = _deployment_or_404(request, pk)
    targets = list(deployment.targets.select_related("host", "previous_version").prefetch_related("events")
                   .order_by("batch", "host__name"))
    may_control = check(Principal.of(request), Action.DEPLOY, model=deployment.model,
                        hosts=[t.host for t in targets]) is None
    for target in targets:
        events = list(target.events.all())
        target.step_log = events
        target.duration = (events[-1].created_at - events[0].created_at).total_seconds() if len(events) > 1 else None
    return {
        "deployment": deployment, "targets": targets, "events": deployment.events.all(),
        "active": deployment.status in ACTIVE_DEPLOYMENT_STATUSES,
        "batches": max((t.batch for t in targets), default=0) + 1,
        "may_control": may_control, "canary": canaries.canary_summary(deployment, targets),
    }


@login_required
def rollout_detail(request, pk: int):
    """A rollout: per-host step progress and log, batches, status history and the controls."""
    return render(request, "deployments/rollout_detail.html", _rollout_context(request, pk))


@login_required
@require_POST
def rollout_canary(request, pk: int):
    """Change a canary's percent from its rollout page (POST ``percent``)."""
    deployment = _deployment_or_404(request, pk)
    forbidden_unless(request, Action.DEPLOY, model=deployment.model,
                     hosts=[t.host for t in deployment.targets.select_related("host")])
    try:
        percent = float(request.POST.get("percent", ""))
        canaries.set_traffic(deployment.pk, canary_percent=percent, actor=request.user)
    except ValueError:
        messages.error(request, "The canary percent must be a number from 0 to 100.")
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"The canary now takes {percent:g} % of the requests that name no version.")
    return redirect("deployments:rollout-detail", pk=pk)


@login_required
def rollout_progress(request, pk: int):
    """The htmx fragment of the rollout page, polled while the rollout runs."""
    return render(request, "deployments/partials/rollout_progress.html", _rollout_context(request, pk))


@login_required
def rollout_action(request, pk: int, action: str):
    """Pause, resume, cancel or roll back a rollout (POST); cancel and rollback are confirmed on a GET page first."""
    if action not in ROLLOUT_ACTIONS:
        raise Http404(f"no rollout action {action!r}")
    deployment = _deployment_or_404(request, pk)
    forbidden_unless(request, Action.DEPLOY, model=deployment.model,
                     hosts=[t.host for t in deployment.targets.select_related("host")])
    if request.method != "POST":
        if action not in CONFIRMED_ACTIONS:
            return redirect("deployments:rollout-detail", pk=pk)
        return render(request, "deployments/rollout_confirm.html", {"deployment": deployment, "action": action})
    run, done = ROLLOUT_ACTIONS[action]
    try:
        run(deployment.pk, actor=request.user)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, done)
    return redirect("deployments:rollout-detail", pk=pk)


def _deployment_or_404(request, pk: int):
    """Deployment ``pk`` if the user may read its model (else the same 404 as for a missing one)."""
    deployment = found_or_404(get_deployment, pk)
    if not visible_models(Principal.of(request)).filter(pk=deployment.model_id).exists():
        raise Http404(f"no deployment {pk}")
    return deployment


def _hosts_serving(model) -> list[str]:
    return sorted({t.host.name for t in serving_now(deployment__model=model)})


@login_required
def rollout_create(request, model_name: str):
    """Start a rollout of one model from the browser; on success, go to its rollout page.

    The version defaults to ``?version=N`` (the version page's "Roll out…"), else the newest. Each
    host is shown with its runtime, agent state, the version it serves and its production mark; a
    host that is offline or never reported is refused with the reason until the form confirms it.
    """
    model = model_or_404(request, model_name, Action.DEPLOY)
    principal = Principal.of(request)
    versions = list(model.versions.exclude(status="deleted").order_by("-version").values_list("version", flat=True))
    form = RolloutForm(request.POST or None, versions=versions,
                       aliases=list(model.aliases.order_by("name").values_list("name", flat=True)),
                       hosts=rollout_host_rows(model),
                       initial={"version": request.GET.get("version") or (versions[0] if versions else None),
                                "config_overrides": request.GET.get("config_overrides", "")})
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            deployment = start_deployment(
                model_name=model.name, version=data["version"], alias=data["alias"], host_names=data["hosts"],
                selector=data["selector"], replicas=data["replicas"], batch_size=data["batch_size"],
                failure_policy=data["failure_policy"], config_overrides=data["config_overrides"], actor=request.user,
                authorize=lambda version, hosts: require(principal, Action.DEPLOY, model=model, hosts=hosts),
                confirm_breaking=data["confirm_breaking"], max_request_bytes=data["max_request_bytes"],
                canary_percent=data["canary_percent"], shadow_percent=data["shadow_percent"],
                residency=data["residency"] or Residency.ALWAYS, pinned=data["pinned"],
                cold_start_timeout=data["cold_start_timeout"],
            )
        except BreakingSignature as exc:
            form.add_error("confirm_breaking", exc.message.replace(" (confirm_breaking)", " below"))
        except DomainError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Rollout {deployment.pk} started.")
            return redirect("deployments:rollout-detail", pk=deployment.pk)
    return render(request, "deployments/rollout_form.html", {"form": form, "model": model})


MODEL_DEPLOYMENTS_SHOWN = 20


@login_required
def model_deployments(request, model_name: str):
    """The deployments panel of a model's page (``?version=N``: of one version's page): the newest
    ``MODEL_DEPLOYMENTS_SHOWN`` deployments with each host's state and error, loaded by htmx."""
    model = model_or_404(request, model_name)
    deployments = Deployment.objects.filter(model=model)
    version = request.GET.get("version", "")
    if version:
        if not (version.isascii() and version.isdigit()):  # '²'.isdigit() is True, int('²') fails
            raise Http404("version must be a whole number")
        deployments = deployments.filter(version__version=int(version))
    deployments = (deployments.select_related("version", "created_by").prefetch_related("targets__host")
                   .order_by("-id")[:MODEL_DEPLOYMENTS_SHOWN])
    return render(request, "deployments/partials/model_deployments.html",
                  {"model": model, "deployments": deployments, "version": version})


@login_required
def model_serving(request, model_name: str):
    """The serving panel at the top of a model's page (htmx, polled): each host with the version of
    the model it serves, that version's aliases, its agent's state and its step in an active
    rollout; and each active rollout with its canary batch (``deployments.serving.model_serving``)."""
    model = model_or_404(request, model_name)
    return render(request, "deployments/partials/model_serving.html", {"model": model, **serving_panel(model)})


@login_required
def model_capture(request, model_name: str):
    """The "Request capture" panel of a model's page (htmx): its settings and what each Triton host serving it
    holds (counts and times, never bodies); owners of the model's team change the settings with its form
    (POST, which redirects to the model's page with a message)."""
    model = model_or_404(request, model_name)
    may_change = check(Principal.of(request), Action.MANAGE_CAPTURE, model=model) is None
    if request.method == "POST":
        model = model_or_404(request, model_name, Action.MANAGE_CAPTURE)
        form = CaptureForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                _, warnings = set_capture(model_name=model.name, actor=Principal.of(request),
                                          fraction=data["fraction"], max_bytes=data["max_mib"] * 1024**2,
                                          retention_seconds=round(data["retention_days"] * 86_400))
            except DomainError as exc:
                messages.error(request, f"Capture unchanged: {exc.message}")
            else:
                messages.success(request, "Capture settings saved." + "".join(f" {w}." for w in warnings))
        else:
            messages.error(request, "Capture unchanged: " + "; ".join(
                " ".join(errors) for errors in form.errors.values()))
        return redirect("registry:model-detail", model.name)
    panel = capture_panel(model)
    settings_now = panel["settings"]
    form = CaptureForm(initial={"fraction": settings_now["fraction"], "max_mib": settings_now["max_bytes"] // 1024**2,
                                "retention_days": settings_now["retention_seconds"] / 86_400})
    return render(request, "deployments/partials/model_capture.html",
                  {"model": model, "panel": panel, "form": form, "may_change": may_change})


@login_required
def try_it(request, model_name: str):
    """Send an input (the version's sample, or JSON typed in) to a deployed version and show the outputs."""
    model = model_or_404(request, model_name, Action.DEPLOY, doing="trying a model")
    versions = list(model.versions.exclude(status="deleted").order_by("-version"))
    sample = next((v.metadata.get("sample_input") for v in versions if (v.metadata or {}).get("sample_input")), None)
    form = TryItForm(request.POST or None, hosts=_hosts_serving(model), versions=[v.version for v in versions],
                     initial={"inputs": json.dumps(sample) if sample else ""})
    result = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            result = try_inference(model_name=model.name, host_name=data["host"], inputs=data["inputs"],
                                   version=data["version"])
        except DomainError as exc:
            form.add_error(None, exc.message)
    return render(request, "deployments/try_it.html", {"form": form, "model": model, "result": result})


@login_required
def host_model_unload(request, name: str, model_name: str):
    """Unload a model from a host (rights of a rollout there): GET asks for confirmation, POST unloads."""
    host = found_or_404(get_host, name)
    model_or_404(request, model_name, Action.DEPLOY, hosts=[host], doing=lifecycle.describe_host_operation(host))
    target = found_or_404(serving_target, name, model_name)
    if request.method == "POST":
        try:
            version = unload_model(host_name=name, model_name=model_name, actor=request.user)
        except DomainError as exc:
            messages.error(request, exc.message)
        else:
            messages.success(request, f"{model_name} v{version} is being unloaded from {name}.")
        return redirect("deployments:host-detail", name=name)
    return render(request, "deployments/host_model_confirm_unload.html", {"target": target})


@login_required
def host_model_reload(request, name: str, model_name: str):
    """Load again the version of a model last unloaded from a host (rights of a rollout there, POST)."""
    host = found_or_404(get_host, name)
    model_or_404(request, model_name, Action.DEPLOY, hosts=[host], doing=lifecycle.describe_host_operation(host))
    if request.method != "POST":
        return redirect("deployments:host-detail", name=name)
    try:
        deployment = reload_model(host_name=name, model_name=model_name, actor=request.user)
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("deployments:host-detail", name=name)
    messages.success(request, f"Reloading {model_name} on {name}.")
    return redirect("deployments:rollout-detail", pk=deployment.pk)
