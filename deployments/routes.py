"""The route a host's gateway holds for a model: what the orchestrator wants it to hold (the stable and
canary versions, the traffic shares, the request capture settings), what the host's heartbeat last reported
of route and capture, and whether its gateway can capture at all.

The canaries (``deployments.canaries``) and request capture (``deployments.capture``) both send and repair
routes; this module is what they share, so neither imports the other.
"""

from deployments.models import DeploymentTarget, ServingHost
from modelyard_agent.contract import CAPTURE_PROTOCOL, Runtime

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
