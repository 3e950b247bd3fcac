"""The route a host's gateway holds for a model: what the orchestrator wants it to hold (the stable and
canary versions, the traffic shares, the request capture settings), what the host's heartbeat last reported
of route and capture, and whether its gateway can capture at all.

The canaries (``deployments.canaries``) and request capture (``deployments.capture``) both send and repair
routes; this module is what they share, so neither imports the other.
"""

from django.db.models import F

from deployments.models import DeploymentTarget, ServingHost
from modelyard_agent.contract import CAPTURE_PROTOCOL, Runtime
from registry.models import InferenceKey, RegisteredModel

SETTINGS = ("fraction", "max_bytes", "retention_seconds")


def wanted_capture(model) -> dict:
    """``contract.CaptureSettings`` of a RegisteredModel."""
    return {"fraction": float(model.capture_fraction), "max_bytes": int(model.capture_max_bytes),
            "retention_seconds": int(model.capture_retention_seconds)}


def reported_capture(host: ServingHost, runtime_name: str) -> dict | None:
    """What ``host``'s gateway last reported of the model's capture (``GatewayReport.capture``), or None."""
    return (((host.heartbeat or {}).get("gateway") or {}).get("capture") or {}).get(runtime_name)


def why_no_capture(host: ServingHost) -> str | None:
    """Why ``host`` cannot capture requests now (a sentence naming it), or None when it can."""
    heartbeat = host.heartbeat or {}
    protocol = int((heartbeat.get("agent") or {}).get("protocol") or 1)
    if host.runtime != Runtime.TRITON:
        return f"{host.name} is a {host.runtime} host: request capture runs on Triton hosts' gateways only"
    if protocol < CAPTURE_PROTOCOL:
        return (f"{host.name}'s agent speaks protocol {protocol}, request capture needs {CAPTURE_PROTOCOL}: it "
                "captures nothing until upgraded (pip install -U ./modelyard_agent)")
    if not (heartbeat.get("gateway") or {}).get("live"):
        return (f"{host.name} reports no live gateway (run its agent with --triton-url): it captures nothing until "
                "it does")
    return None


def capture_differs(target: DeploymentTarget) -> bool:
    """True when the gateway of ``target``'s host last reported other capture settings for its model than
    the registry's (a model with capture off must be absent from the report)."""
    want = wanted_capture(target.deployment.model)
    have = reported_capture(target.host, target.runtime_name)
    if want["fraction"] == 0:
        return have is not None
    return have is None or any(have.get(key) != want[key] for key in SETTINGS)


def route_payload(target: DeploymentTarget, percent: float, shadow_percent: float | None) -> dict:
    """The ``contract.RoutePayload`` that sets ``percent`` (and mirrors ``shadow_percent``) on ``target``'s
    host: its stable version (the target's ``previous_version``) and the deployment's version, with the
    model's request capture settings (``wanted_capture``)."""
    version = target.deployment.version.version
    return {
        "host": target.host.name, "runtime": target.host.runtime, "model": target.runtime_name,
        "inference_url": target.host.inference_url, "metrics_url": target.host.metrics_url,
        "stable": target.previous_version.version, "canary": version, "percent": float(percent),
        "shadow": version if shadow_percent else None, "shadow_percent": float(shadow_percent or 0),
        "capture": wanted_capture(target.deployment.model),
    }


def reported_route(target: DeploymentTarget) -> dict:
    """The route the gateway of ``target``'s host last reported for its model (``{}`` when none)."""
    routes = ((target.host.heartbeat or {}).get("gateway") or {}).get("routes") or {}
    return routes.get(target.runtime_name) or {}


def wanted_inference_keys(host: ServingHost) -> dict[str, list[str]]:
    """The inference keys ``host``'s gateway should accept, per model, for its route push.

    Args:
        host: the serving host; the models are those that have a deployment target on it and require an
            inference key (``RegisteredModel.inference_key_required``).

    Returns:
        ``{model name: [digest, ...]}``: each digest the hex SHA-256 (64 lower-case characters) of a key of
        the model's team scoped to the model, neither revoked nor expired now, sorted. A model that requires
        a key and has no usable one maps to ``[]`` (no key opens it); a model that requires none is absent.
        Two queries, whatever the number of models and keys. Reads only; no errors of its own.
    """
    names = (RegisteredModel.objects.filter(
        inference_key_required=True,
        pk__in=DeploymentTarget.objects.filter(host=host).values("deployment__model"),
    ).values_list("name", flat=True))
    wanted: dict[str, list[str]] = {name: [] for name in names}
    if not wanted:
        return wanted
    # One filter() for both conditions on the key's models, so they hold for the same model (one join):
    # a key opens a model only while the model is its team's (a model moved to another team leaves it).
    rows = (InferenceKey.objects.usable()
            .filter(scoped_models__name__in=list(wanted), scoped_models__team=F("team"))
            .values_list("scoped_models__name", "digest"))
    for name, digest in rows:
        wanted[name].append(digest)
    return {name: sorted(digests) for name, digests in wanted.items()}
