"""Prometheus HTTP service discovery: the registered serving hosts as scrape targets.

``GET /api/v1/prometheus/targets/`` answers in the http_sd format
(https://prometheus.io/docs/prometheus/latest/http_sd/), so a Prometheus job with
``http_sd_configs`` pointing here scrapes every host registered through the API
without a config edit (the shipped configs refresh every 15 s).

Labels of each target group:

- ``host``: the serving host's name, the label every product query selects hosts by;
- ``runtime``: the host's runtime (``triton``);
- ``__scheme__``, ``__metrics_path__`` and one ``__param_<name>`` per query parameter: how to
  reach its ``metrics_url`` (Prometheus drops ``__`` labels after relabelling);
- ``label_<key>``: each of the host's own labels, the key with every character outside
  ``[a-zA-Z0-9_]`` replaced by ``_`` (when two keys collide, the first in sorted order wins).

Triton targets carry no ``model`` label: Triton's own series carry ``model`` and ``version``, and
a target label of the same name would rename those to ``exported_model``. BentoML targets (one
process per model version, a later feature) will carry ``model`` and ``version`` as target labels,
since BentoML's series have neither.
"""

import logging
import re
from urllib.parse import parse_qsl, urlsplit

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from deployments.models import ServingHost

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {"http": 80, "https": 443}
LABEL_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def label_name(key: str) -> str:
    """Return the target label name for a host label ``key``: ``label_`` + key sanitised to [a-zA-Z0-9_]."""
    return "label_" + LABEL_UNSAFE.sub("_", key)


def scrape_target_group(host: ServingHost) -> dict | None:
    """Return the http_sd target group of one serving host.

    Args:
        host: a serving host; its ``metrics_url`` is an http(s) URL (checked at registration).

    Returns:
        ``{"targets": ["<host>:<port>"], "labels": {...}}`` (the port defaults to 80 or 443
        by scheme), or None when the host has no usable ``metrics_url``.
    """
    if not host.metrics_url:
        return None
    parts = urlsplit(host.metrics_url)
    try:
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        port = None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or port is None:
        logger.warning("serving host %s has an unusable metrics_url %r; not a scrape target",
                       host.name, host.metrics_url)
        return None
    address = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    labels = {}
    for key in sorted(host.labels or {}):
        labels.setdefault(label_name(key), str(host.labels[key]))
    labels.update({
        "host": host.name,
        "runtime": host.runtime,
        "__scheme__": parts.scheme,
        "__metrics_path__": parts.path or "/",
    })
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        labels[f"__param_{name}"] = value
    return {"targets": [f"{address}:{port}"], "labels": labels}


def scrape_target_groups() -> list[dict]:
    """Return the http_sd target groups of every serving host that has a ``metrics_url``.

    Returns:
        A list of ``{"targets": [...], "labels": {...}}``, ordered by host name; one SQL query.
    """
    hosts = ServingHost.objects.exclude(metrics_url="").order_by("name")
    return [group for group in map(scrape_target_group, hosts) if group is not None]


class ScrapeTargetGroupSerializer(serializers.Serializer):
    """One http_sd target group: the address to scrape and its labels."""

    targets = serializers.ListField(child=serializers.CharField(), help_text="one host:port")
    labels = serializers.DictField(
        child=serializers.CharField(),
        help_text="host, runtime, __scheme__, __metrics_path__, and label_<key> per host label",
    )


class ScrapeTargetsView(APIView):
    """``GET /api/v1/prometheus/targets/``: serving hosts as Prometheus http_sd target groups.

    Requires an API token (``Authorization: Token <key>``, Prometheus's
    ``authorization: {type: Token, credentials_file: ...}``). Always JSON, never paginated.
    """

    renderer_classes = [JSONRenderer]

    @extend_schema(
        operation_id="prometheus_scrape_targets",
        summary="Serving hosts as Prometheus HTTP service discovery targets",
        responses={200: ScrapeTargetGroupSerializer(many=True)},
        tags=["prometheus"],
    )
    def get(self, request):
        return Response(scrape_target_groups())
