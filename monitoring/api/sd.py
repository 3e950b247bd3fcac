"""Prometheus HTTP service discovery: the registered serving hosts as scrape targets.

``GET /api/v1/prometheus/targets/`` answers in the http_sd format
(https://prometheus.io/docs/prometheus/latest/http_sd/), so a Prometheus job with
``http_sd_configs`` pointing here scrapes every host registered through the API
without a config edit (the shipped configs refresh every 15 s).

Target groups:

- one per host with a ``metrics_url`` (Triton's ``/metrics``, whatever the runtime);
- one per host for its front (a Triton host's gateway, a BentoML host's nginx): ``/metrics`` at the
  host's ``inference_url``, where it answers what it measured of every request it passed
  (``modelyard_agent/runtimes/modelyard_metrics.lua``:
  ``modelyard_gateway_requests_total`` and the histogram ``modelyard_gateway_request_duration_seconds``,
  by ``model``, ``version`` and ``role``), labelled ``source="gateway"``;
- one per model version a BentoML host serves: each ``bentoml serve`` process serves one version
  and its series name neither model nor version, so the target carries them. The process listens
  on a loopback port of its host; the host agent's nginx, at the host's ``inference_url``, answers
  ``/_metrics/<model>/<version>`` with that process's ``/metrics``
  (``modelyard_agent.runtimes.nginx.metrics_path``). Prometheus thus reaches every bento process
  through the one port already open for inference, and a path can only answer with the metrics
  of the version it names (404 once that version no longer serves: the target is down, no
  series is mislabelled). The versions listed are those the host's agent reported serving in its
  last heartbeat, together with those the newest READY deployment target of each model names
  (so a version is scraped from its cut-over on, not from the next heartbeat).

Labels of each target group:

- ``host``: the serving host's name, the label every product query selects hosts by;
- ``runtime``: the host's runtime (``triton`` or ``bentoml``);
- ``model`` and ``version`` (the registered model's name and version number): BentoML targets only;
- ``__scheme__``, ``__metrics_path__`` and one ``__param_<name>`` per query parameter: how to
  reach the target (Prometheus drops ``__`` labels after relabelling);
- ``label_<key>``: each of the host's own labels, the key with every character outside
  ``[a-zA-Z0-9_]`` replaced by ``_`` (when two keys collide, the first in sorted order wins).

Host targets carry no ``model`` label: Triton's own series carry ``model`` and ``version``, and
a target label of the same name would rename those to ``exported_model``.
"""

import logging
import re
from urllib.parse import SplitResult, parse_qsl, urlsplit

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from deployments.choices import Runtime
from deployments.models import ServingHost
from deployments.served import serving_now
from modelyard_agent.runtimes.nginx import metrics_path

logger = logging.getLogger(__name__)

DEFAULT_PORTS = {"http": 80, "https": 443}
GATEWAY_METRICS_PATH = "/metrics"
LABEL_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def label_name(key: str) -> str:
    """Return the target label name for a host label ``key``: ``label_`` + key sanitised to [a-zA-Z0-9_]."""
    return "label_" + LABEL_UNSAFE.sub("_", key)


def _target(host: ServingHost, url: str, field: str) -> tuple[str, SplitResult] | None:
    """``("<host>:<port>", parts)`` of an http(s) URL (the port defaults to 80 or 443 by scheme), or
    None (logged) when the URL cannot be scraped."""
    parts = urlsplit(url)
    try:
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        port = None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname or port is None:
        logger.warning("serving host %s has an unusable %s %r; not a scrape target", host.name, field, url)
        return None
    address = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{address}:{port}", parts


def _host_labels(host: ServingHost) -> dict[str, str]:
    labels = {}
    for key in sorted(host.labels or {}):
        labels.setdefault(label_name(key), str(host.labels[key]))
    labels.update({"host": host.name, "runtime": host.runtime})
    return labels


def scrape_target_group(host: ServingHost) -> dict | None:
    """Return the http_sd target group of one serving host's ``metrics_url``.

    Args:
        host: a serving host; its ``metrics_url`` is an http(s) URL (checked at registration).

    Returns:
        ``{"targets": ["<host>:<port>"], "labels": {...}}`` (the port defaults to 80 or 443
        by scheme), or None when the host has no usable ``metrics_url``.
    """
    if not host.metrics_url:
        return None
    target = _target(host, host.metrics_url, "metrics_url")
    if target is None:
        return None
    address, parts = target
    labels = {**_host_labels(host), "__scheme__": parts.scheme, "__metrics_path__": parts.path or "/"}
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        labels[f"__param_{name}"] = value
    return {"targets": [address], "labels": labels}


def gateway_target_group(host: ServingHost) -> dict | None:
    """Return the http_sd target group of a host's front (a Triton host's gateway, a BentoML host's nginx):
    ``/metrics`` under its ``inference_url``.

    Args:
        host: a serving host; its ``inference_url`` is its front.

    Returns:
        ``{"targets": ["<host>:<port>"], "labels": {..., "source": "gateway", "__metrics_path__":
        "<inference_url path>/metrics"}}``, or None when the ``inference_url`` cannot be scraped.
    """
    target = _target(host, host.inference_url, "inference_url")
    if target is None:
        return None
    address, parts = target
    return {"targets": [address], "labels": {
        **_host_labels(host), "source": "gateway",
        "__scheme__": parts.scheme, "__metrics_path__": parts.path.rstrip("/") + GATEWAY_METRICS_PATH,
    }}


def bento_target_groups(host: ServingHost, versions: set[tuple[str, int]]) -> list[dict]:
    """Return one http_sd target group per model version a BentoML host serves.

    Args:
        host: a serving host with runtime ``bentoml``; its ``inference_url`` is its agent's nginx.
        versions: ``{(model name, version number)}`` served there.

    Returns:
        ``[{"targets": ["<host>:<port>"], "labels": {..., "model", "version", "__metrics_path__":
        "/_metrics/<model>/<version>"}}]`` ordered by model and version; empty when the
        ``inference_url`` cannot be scraped.
    """
    target = _target(host, host.inference_url, "inference_url")
    if target is None:
        return []
    address, parts = target
    prefix = parts.path.rstrip("/")
    return [
        {"targets": [address], "labels": {
            **_host_labels(host), "model": model, "version": str(version),
            "__scheme__": parts.scheme, "__metrics_path__": prefix + metrics_path(model, version),
        }}
        for model, version in sorted(versions)
    ]


def _reported_versions(heartbeat: dict) -> set[tuple[str, int]]:
    """(model, version) pairs a host agent's heartbeat lists as served; a malformed entry is skipped."""
    found = set()
    for entry in (heartbeat if isinstance(heartbeat, dict) else {}).get("models") or []:
        try:
            found.add((str(entry["name"]), int(entry["version"])))
        except (KeyError, TypeError, ValueError):
            continue
    return found


def served_bento_versions() -> dict[int, set[tuple[str, int]]]:
    """What each BentoML host serves: ``{host id: {(model, version)}}``, from its last heartbeat and
    from the newest READY deployment target of each model there; at most three SQL queries."""
    served: dict[int, set[tuple[str, int]]] = {}
    for host_id, heartbeat in ServingHost.objects.filter(runtime=Runtime.BENTOML).values_list("pk", "heartbeat"):
        served[host_id] = _reported_versions(heartbeat)
    for target in serving_now(host__runtime=Runtime.BENTOML):
        served.setdefault(target.host_id, set()).add((target.deployment.model.name, target.deployment.version.version))
    return served


def scrape_target_groups() -> list[dict]:
    """Return the http_sd target groups of every serving host (see the module docstring).

    Returns:
        A list of ``{"targets": [...], "labels": {...}}``, ordered by host name, each host's
        ``metrics_url`` group, then its front's, then its BentoML version groups; at most four SQL queries.
    """
    served = served_bento_versions()
    groups = []
    for host in ServingHost.objects.defer("heartbeat", "config_overrides").order_by("name"):
        group = scrape_target_group(host)
        if group is not None:
            groups.append(group)
        if (gateway := gateway_target_group(host)) is not None:
            groups.append(gateway)
        if host.runtime == Runtime.BENTOML:
            groups.extend(bento_target_groups(host, served.get(host.pk, set())))
    return groups


class ScrapeTargetGroupSerializer(serializers.Serializer):
    """One http_sd target group: the address to scrape and its labels."""

    targets = serializers.ListField(child=serializers.CharField(), help_text="one host:port")
    labels = serializers.DictField(
        child=serializers.CharField(),
        help_text="host, runtime, __scheme__, __metrics_path__, label_<key> per host label; source=gateway on "
                  "the target of a host's front, model and version on the targets of BentoML model versions",
    )


class ScrapeTargetsView(APIView):
    """``GET /api/v1/prometheus/targets/``: serving hosts, and each model version a BentoML host
    serves, as Prometheus http_sd target groups.

    Requires an API token (``Authorization: Token <key>``, Prometheus's
    ``authorization: {type: Token, credentials_file: ...}``). Always JSON, never paginated.
    """

    renderer_classes = [JSONRenderer]

    @extend_schema(
        operation_id="prometheus_scrape_targets",
        summary="Serving hosts and BentoML model versions as Prometheus HTTP service discovery targets",
        responses={200: ScrapeTargetGroupSerializer(many=True)},
        tags=["prometheus"],
    )
    def get(self, request):
        return Response(scrape_target_groups())
