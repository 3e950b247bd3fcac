"""The app's own metrics, exposed on ``/metrics`` for Prometheus.

Every value is computed at scrape time from the database and the Celery broker
rather than kept in in-process counters: gunicorn and Celery run many processes,
and any one of them may answer a scrape. A scrape costs a fixed number of SQL
queries (six) and one Redis round trip, whatever the number of rows.

Series (all counts are plain numbers, durations are seconds):

``modelyard_registered_models``
    Gauge. Registered models (count).
``modelyard_model_versions{status}``
    Gauge. Model versions per ``VersionStatus`` (count); every status is present, 0 when none.
``modelyard_deployments_total{status}``
    Gauge. Deployments (rollouts) per status (``DeploymentStatus``): ``running`` and
    ``paused`` rise and fall; ``succeeded``, ``failed``, ``cancelled`` are terminal and only
    grow, except that a rollback moves one to ``rolled_back`` (``increase()`` over a terminal
    status counts rollouts finished in a window). The sum is every rollout ever started.
``modelyard_deployment_targets{state}``
    Gauge. Per-host parts of deployments per ``TargetState`` (count).
``modelyard_target_step_duration_seconds{step}``
    Histogram (``_bucket{le}``, ``_count``, ``_sum``) of how long each step of a rollout took on a
    host, in seconds, over targets that finished (ready or failed). ``step`` is ``stage``
    (download, check, extract), ``load`` (load next to the old versions) or ``cutover`` (unload the
    old versions), read from the agent's ``<step>_seconds`` report in ``DeploymentTarget.details``;
    a target that never reached a step is not counted for it. Buckets: ``STEP_BUCKETS_SECONDS``.
``modelyard_celery_queue_length{queue}``
    Gauge. Messages waiting on the broker in the Celery queue ``default`` and in each registered
    host's ``host.<name>`` queue (count; messages a worker has already reserved are not included).
    Absent when the broker does not answer.
``modelyard_celery_broker_up``
    Gauge. 1 when the Redis broker (``settings.CELERY_BROKER_URL``) answered during the scrape, else 0.

Access: open by default (counts only); with ``settings.METRICS_TOKEN`` set a scrape must send
``Authorization: Bearer <token>``. A refusal is the API's error envelope (``modelyard.api_errors``).
"""

import hmac
import logging
from collections.abc import Iterator

import redis
from django.conf import settings
from django.db.models import Case, Count, FloatField, Q, Sum, When
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from deployments.choices import TERMINAL_TARGET_STATES, DeploymentStatus, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from modelyard.api_errors import error_json
from modelyard_agent.contract import ORCHESTRATOR_QUEUE, host_queue
from registry.choices import VersionStatus
from registry.models import ModelVersion, RegisteredModel

logger = logging.getLogger(__name__)

STEP_BUCKETS_SECONDS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
STEPS = ("stage", "load", "cutover")
DEFAULT_QUEUE = ORCHESTRATOR_QUEUE
# kombu's Redis transport keeps messages sent with a priority in sibling lists
# named "<queue>\x06\x16<priority>"; messages without one sit in "<queue>".
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
BROKER_TIMEOUT_SECONDS = 1.0
# Every name here is a classic one ([a-zA-Z_:][a-zA-Z0-9_:]*), so generate_latest's output is the
# text format 0.0.4 that every Prometheus 2.x parses; say so rather than the library's newest label.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A non-negative JSON number as ``->>`` renders it; anything else in a report is skipped
# rather than failing the whole scrape on a cast.
NUMBER_PATTERN = r"^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"


def _step_seconds(step: str) -> Case:
    key = f"{step}_seconds"
    return Case(
        When(Q(**{f"details__{key}__regex": NUMBER_PATTERN}),
             then=Cast(KeyTextTransform(key, "details"), FloatField())),
        default=None,
        output_field=FloatField(),
    )


def _counts_by(queryset, field: str) -> dict[str, int]:
    rows = queryset.order_by().values(field).annotate(n=Count("pk")).values_list(field, "n")
    return dict(rows)


def deployment_status_counts() -> dict[str, int]:
    """Count deployments per ``DeploymentStatus`` in one SQL query.

    Returns:
        ``{status: count}`` with every ``DeploymentStatus`` value as a key.
    """
    found = _counts_by(Deployment.objects.all(), "status")
    return {status: found.get(status, 0) for status in DeploymentStatus.values}


def step_duration_histograms() -> dict[str, dict]:
    """Histograms of the rollout step durations of finished targets, in one SQL query.

    Returns:
        ``{step: {"buckets": [(upper bound in s, cumulative count), ...], "count": int,
        "sum": seconds}}`` for each of ``STEPS``; the buckets are ``STEP_BUCKETS_SECONDS``
        without ``+Inf`` (whose count is ``count``).
    """
    aggregates = {}
    for step in STEPS:
        for i, bound in enumerate(STEP_BUCKETS_SECONDS):
            aggregates[f"{step}_le_{i}"] = Count("pk", filter=Q(**{f"{step}__lte": bound}))
        aggregates[f"{step}_count"] = Count(step)
        aggregates[f"{step}_sum"] = Sum(step)
    row = (
        DeploymentTarget.objects.order_by()
        .filter(state__in=TERMINAL_TARGET_STATES)
        .annotate(**{step: _step_seconds(step) for step in STEPS})
        .aggregate(**aggregates)
    )
    return {
        step: {
            "buckets": [(bound, row[f"{step}_le_{i}"]) for i, bound in enumerate(STEP_BUCKETS_SECONDS)],
            "count": row[f"{step}_count"],
            "sum": row[f"{step}_sum"] or 0.0,
        }
        for step in STEPS
    }


def celery_queue_lengths(host_names: list[str], broker_url: str) -> dict[str, int] | None:
    """Messages waiting in the ``default`` queue and each ``host.<name>`` queue, from Redis.

    Args:
        host_names: registered serving host names.
        broker_url: a ``redis://``, ``rediss://`` or ``unix://`` Celery broker URL.

    Returns:
        ``{queue: count}``, or None when the broker cannot be reached within
        ``BROKER_TIMEOUT_SECONDS`` or the URL is not a Redis one. One round trip.
    """
    queues = [DEFAULT_QUEUE, *(host_queue(name) for name in host_names)]
    try:
        client = redis.Redis.from_url(
            broker_url, socket_connect_timeout=BROKER_TIMEOUT_SECONDS, socket_timeout=BROKER_TIMEOUT_SECONDS
        )
    except ValueError:
        logger.warning("the Celery broker URL is not a Redis URL; queue lengths are not exported")
        return None
    try:
        pipe = client.pipeline(transaction=False)
        for queue in queues:
            pipe.llen(queue)
            for priority in PRIORITY_STEPS:
                pipe.llen(f"{queue}{PRIORITY_SEPARATOR}{priority}")
        replies = pipe.execute(raise_on_error=False)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        logger.warning("the Celery broker did not answer: %s", exc)
        return None
    finally:
        client.close()
    per_queue = 1 + len(PRIORITY_STEPS)
    lengths = {}
    for i, queue in enumerate(queues):
        # A key holding something other than a list (WRONGTYPE) is not a queue.
        lengths[queue] = sum(r for r in replies[i * per_queue:(i + 1) * per_queue] if isinstance(r, int))
    return lengths


class ModelyardCollector:
    """A prometheus_client collector that reads every series from the database and Redis per scrape."""

    def collect(self) -> Iterator[Metric]:
        """Yield the metric families listed in the module docstring."""
        models = GaugeMetricFamily("modelyard_registered_models", "Registered models (count).")
        models.add_metric([], RegisteredModel.objects.count())
        yield models

        versions = GaugeMetricFamily(
            "modelyard_model_versions", "Model versions by status (count).", labels=["status"]
        )
        version_counts = _counts_by(ModelVersion.objects.all(), "status")
        for status in VersionStatus.values:
            versions.add_metric([status], version_counts.get(status, 0))
        yield versions

        deployments = GaugeMetricFamily(
            "modelyard_deployments_total",
            "Deployments (rollouts) by status derived from their targets: in_progress, ready, failed (count).",
            labels=["status"],
        )
        for status, count in deployment_status_counts().items():
            deployments.add_metric([status], count)
        yield deployments

        targets = GaugeMetricFamily(
            "modelyard_deployment_targets", "Per-host parts of deployments by state (count).", labels=["state"]
        )
        target_counts = _counts_by(DeploymentTarget.objects.all(), "state")
        for state in TargetState.values:
            targets.add_metric([state], target_counts.get(state, 0))
        yield targets

        durations = HistogramMetricFamily(
            "modelyard_target_step_duration_seconds",
            "Duration of each rollout step (stage, load, cutover) on a host, over finished targets (seconds).",
            labels=["step"],
        )
        for step, histogram in step_duration_histograms().items():
            buckets = [(floatToGoString(bound), count) for bound, count in histogram["buckets"]]
            buckets.append(("+Inf", histogram["count"]))
            durations.add_metric([step], buckets, histogram["sum"])
        yield durations

        host_names = list(ServingHost.objects.order_by("name").values_list("name", flat=True))
        lengths = celery_queue_lengths(host_names, settings.CELERY_BROKER_URL)
        broker_up = GaugeMetricFamily(
            "modelyard_celery_broker_up", "1 when the Celery broker (Redis) answered this scrape, else 0."
        )
        broker_up.add_metric([], 0 if lengths is None else 1)
        yield broker_up
        if lengths is not None:
            queues = GaugeMetricFamily(
                "modelyard_celery_queue_length", "Messages waiting in a Celery queue (count).", labels=["queue"]
            )
            for queue, length in lengths.items():
                queues.add_metric([queue], length)
            yield queues


# A registry of its own: the process-wide default one would add this one process's
# internals, which say nothing about the fleet.
METRICS_REGISTRY = CollectorRegistry(auto_describe=False)
METRICS_REGISTRY.register(ModelyardCollector())


SAFE_METHODS = ("GET", "HEAD")


def _refusal(request: HttpRequest) -> HttpResponse | None:
    """The error answer for a request the exporter refuses, or None when it may scrape."""
    if request.method not in SAFE_METHODS:
        return error_json(f"/metrics takes {' and '.join(SAFE_METHODS)}, not {request.method}",
                          "method_not_allowed", 405, headers={"Allow": ", ".join(SAFE_METHODS)})
    token = settings.METRICS_TOKEN
    if not token:
        return None
    header = request.headers.get("Authorization", "")
    scheme, _, credentials = header.partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), token.encode()):
        return None
    challenge = {"WWW-Authenticate": 'Bearer realm="metrics"'}
    if not header:
        return error_json("a bearer token is required", "not_authenticated", 401, headers=challenge)
    return error_json("the bearer token is not the metrics token", "authentication_failed", 401, headers=challenge)


@csrf_exempt  # it changes nothing; a POST must be told 405 in the envelope, not fail the CSRF check in HTML
def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the series above in Prometheus's text format (0.0.4).

    401 with ``WWW-Authenticate: Bearer`` when ``settings.METRICS_TOKEN`` is set and the request
    does not carry it (``not_authenticated``, or ``authentication_failed`` for another token); 405
    ``method_not_allowed`` for a method other than GET and HEAD; 200 even when the broker is down
    (``modelyard_celery_broker_up 0``).
    """
    if (refusal := _refusal(request)) is not None:
        return refusal
    response = HttpResponse(generate_latest(METRICS_REGISTRY), content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
