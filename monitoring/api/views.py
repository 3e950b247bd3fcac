"""Monitoring API: per-model metrics from Prometheus."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import Principal
from deployments.profiles import compare_cards
from modelyard.api import error_responses
from modelyard.errors import InvalidInput, ServiceUnavailable
from monitoring import services
from registry.access import model_for
from registry.compare import compare_versions
from registry.versions import get_version

RANGE_PARAMETER = OpenApiParameter(
    "range", OpenApiTypes.STR, description="Window such as 15m, 1h, 6h, 24h, 7d (default 15m)"
)


class ModelMetricsView(APIView):
    """``GET /api/v1/models/<name>/metrics/?range=15m``: per version, throughput (inferences/s), mean
    latency from counters and p50/p95/p99 (ms), queue and compute time (ms), error rate (0..1) and
    pending requests, as ``monitoring.services.model_metrics`` gives them; the fleet overview and the
    model page show the same figures for the same range. 503 when Prometheus is unreachable."""

    @extend_schema(parameters=[RANGE_PARAMETER], responses={200: OpenApiTypes.OBJECT, **error_responses(404, 503)})
    def get(self, request, model_name: str):
        model_for(Principal.of(request), model_name)
        return Response(services.model_metrics(model_name, request.query_params.get("range", "15m")))


class ModelMetricSeriesView(APIView):
    """``GET /api/v1/models/<name>/metrics/series/?range=15m``: the same metrics as time series."""

    @extend_schema(parameters=[RANGE_PARAMETER], responses={200: OpenApiTypes.OBJECT, **error_responses(404, 503)})
    def get(self, request, model_name: str):
        model_for(Principal.of(request), model_name)
        return Response(services.model_series(model_name, request.query_params.get("range", "15m")))


VERSION_PARAMETERS = [
    OpenApiParameter("a", OpenApiTypes.INT, required=True, description="the version in use (the one replaced)"),
    OpenApiParameter("b", OpenApiTypes.INT, required=True, description="the version that replaces it"),
]


class ModelCompareView(APIView):
    """``GET /api/v1/models/<name>/compare/?a=3&b=4&range=15m``: what changed from version ``a`` to ``b``.

    The signature's inputs, outputs and batching, each ``same``, ``compatible`` or ``breaking`` for the
    clients of ``a`` (``signature.verdict`` the worst); the serving config (backend, instance groups,
    batching); files, sizes and sha256; lineage; offline metrics with their change; ``performance``:
    both versions' performance cards host by host, each one's recommendation and, where both have a
    card on a host, b over a in throughput and p99 (``deployments.profiles.compare_cards``); and
    ``serving``: both versions' serving metrics over the same window (as ``/metrics/``), or
    ``serving_error`` when Prometheus cannot answer (the rest is still given).
    """

    @extend_schema(parameters=[*VERSION_PARAMETERS, RANGE_PARAMETER],
                   responses={200: OpenApiTypes.OBJECT, **error_responses(404)})
    def get(self, request, model_name: str):
        principal = Principal.of(request)
        model_for(principal, model_name)
        numbers = {}
        for key in ("a", "b"):
            text = request.query_params.get(key, "")
            if not text.isdigit():
                raise InvalidInput(f"{key} must be a version number, e.g. ?a=3&b=4; got {text!r}")
            numbers[key] = int(text)
        older, newer = (get_version(model_name, numbers[key], visible_to=principal) for key in ("a", "b"))
        answer = compare_versions(older, newer)
        answer["performance"] = compare_cards(older, newer)
        range_text = request.query_params.get("range", "15m")
        answer.update(serving=None, serving_error="")
        try:
            summary = services.model_metrics(model_name, range_text)
        except ServiceUnavailable as exc:
            answer["serving_error"] = exc.message
        else:
            rows = {str(row["version"]): row for row in summary["versions"]}
            answer["serving"] = {"range": summary["range"], "range_seconds": summary["range_seconds"],
                                 "a": rows.get(str(older.version)), "b": rows.get(str(newer.version))}
        return Response(answer)
