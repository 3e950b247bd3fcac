"""Monitoring API: per-model metrics from Prometheus."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import Principal
from modelyard.api import error_responses
from monitoring import services
from registry.access import model_for

RANGE_PARAMETER = OpenApiParameter(
    "range", OpenApiTypes.STR, description="Window such as 15m, 1h, 6h, 24h, 7d (default 15m)"
)


class ModelMetricsView(APIView):
    """``GET /api/v1/models/<name>/metrics/?range=15m``: throughput (inferences/s), mean and
    p95 latency (ms) and error rate (0..1) per version. 503 when Prometheus is unreachable."""

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
