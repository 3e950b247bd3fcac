"""Monitoring pages and fragments."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from deployments.models import ServingHost
from modelyard.errors import ServiceUnavailable
from monitoring import services
from registry.models import RegisteredModel
from registry.services import get_model

PANEL_RANGE = "15m"


def metrics_panel_context(model: RegisteredModel) -> dict:
    """Context of the model metrics fragment: per-version summary and host memory.

    Never raises for Prometheus trouble: ``prometheus_error`` carries the
    notice to show instead.
    """
    host_names = list(
        ServingHost.objects.filter(targets__deployment__model=model).distinct().order_by("name")
        .values_list("name", flat=True)
    )
    context = {"model": model, "range": PANEL_RANGE, "summary": None, "hosts": [], "prometheus_error": ""}
    try:
        context["summary"] = services.model_metrics(model.name, PANEL_RANGE)
        context["hosts"] = services.host_memory(host_names)
    except ServiceUnavailable as exc:
        context["prometheus_error"] = exc.message
    return context


@login_required
def model_metrics_panel(request, name: str):
    """The htmx-refreshed metrics fragment of the model page."""
    return render(request, "monitoring/partials/model_metrics.html", metrics_panel_context(get_model(name)))
