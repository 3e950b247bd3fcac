"""Registry pages: the models list, a model's page and the audit log."""

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Max, Q
from django.http import Http404
from django.shortcuts import redirect, render

from deployments.models import Deployment
from modelyard.errors import NotFound
from monitoring.promql import PAGE_RANGES
from monitoring.views import PANEL_RANGE, metrics_panel_context
from registry.choices import AuditAction, VersionStatus
from registry.filters import RegisteredModelFilter
from registry.models import AuditEvent, RegisteredModel
from registry.services import artifact_download_url, get_model, get_version

MODEL_PAGE_SIZE = 50


@login_required
def model_list(request):
    """Registered models with their latest version number and version count, searchable
    (``search``, ``tag``, ``alias``) and paginated."""
    live = ~Q(versions__status=VersionStatus.DELETED)
    found = RegisteredModelFilter(request.GET, queryset=RegisteredModel.objects.all())
    models = found.qs.annotate(
        latest_version=Max("versions__version", filter=live),
        version_count=Count("versions", filter=live, distinct=True),
    ).order_by("name")
    page = Paginator(models, MODEL_PAGE_SIZE).get_page(request.GET.get("page"))
    query = urlencode({k: v for k, v in request.GET.items() if k != "page" and v})
    return render(request, "registry/model_list.html", {
        "page": page, "filters": found.form.cleaned_data if found.is_valid() else {}, "errors": found.errors,
        "query": query,
    })


@login_required
def model_detail(request, name: str):
    """A model's versions, deployments with per-host state, and live metrics."""
    try:
        model = get_model(name)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    versions = (
        model.versions.exclude(status=VersionStatus.DELETED).select_related("created_by")
        .prefetch_related("aliases").order_by("-version")
    )
    deployments = (
        Deployment.objects.filter(model=model).select_related("version", "created_by")
        .prefetch_related("targets__host").order_by("-id")[:20]
    )
    chart_range = request.GET.get("range", PANEL_RANGE)
    if chart_range not in PAGE_RANGES:
        chart_range = PANEL_RANGE
    context = {
        "model": model, "versions": versions, "deployments": deployments, "ranges": PAGE_RANGES,
        **metrics_panel_context(model, chart_range),
    }
    return render(request, "registry/model_detail.html", context)


AUDIT_PAGE_SIZE = 50


@login_required
def audit_log(request):
    """The audit log, newest first, filterable by action, model and actor (``?action=&model=&actor=``)."""
    events = AuditEvent.objects.select_related("model").order_by("-id")
    filters = {key: request.GET.get(key, "").strip() for key in ("action", "model", "actor")}
    if filters["action"]:
        events = events.filter(action=filters["action"])
    if filters["model"]:
        events = events.filter(model__name=filters["model"])
    if filters["actor"]:
        events = events.filter(actor_label=filters["actor"])
    page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "registry/audit_log.html", {
        "page": page, "filters": filters, "actions": AuditAction.choices,
        "query": urlencode({k: v for k, v in filters.items() if v}),
    })


@login_required
def version_detail(request, name: str, version: int):
    """One version: signature, config.pbtxt, files, metadata, aliases and its deployments."""
    try:
        model_version = get_version(name, version)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    deployments = (
        Deployment.objects.filter(version=model_version).select_related("created_by")
        .prefetch_related("targets__host").order_by("-id")
    )
    return render(request, "registry/version_detail.html", {
        "model": model_version.model, "version": model_version, "deployments": deployments,
        "aliases": model_version.aliases.order_by("name"),
    })


@login_required
def version_download(request, name: str, version: int):
    """Redirect to a presigned S3 URL for the version's artifact."""
    try:
        model_version = get_version(name, version)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    return redirect(artifact_download_url(model_version))
