"""Sending the inference keys a host's front checks (``contract.KeysPayload``, ``AgentTask.KEYS``).

When a key is created or revoked, or a model's requirement is switched (``registry.signals.inference_keys_changed``),
every host with a deployment target of the models concerned is sent those models' keys alone, as
``deployments.routes.wanted_inference_keys`` computes them once the change is committed: a revoked key stops
opening its model at the first push that reaches the host.
"""

from __future__ import annotations

from django.db import transaction

from deployments.enqueue import send_to_host
from deployments.models import DeploymentTarget, ServingHost
from deployments.routes import wanted_inference_keys
from modelyard_agent.contract import AgentTask


def keys_payload(host: ServingHost, names: dict[str, str]) -> dict:
    """The ``contract.KeysPayload`` for ``host`` of the models ``names`` maps (``{name on the host's runtime:
    registry name}``): each one's digests, or None when it requires no key. Reads only (two queries)."""
    wanted = wanted_inference_keys(host)
    return {"host": host.name, "runtime": host.runtime,
            "inference_url": host.inference_url, "metrics_url": host.metrics_url,
            "keys": {served: wanted.get(name) for served, name in sorted(names.items())}}


def send_inference_keys(model_pks: list[int]) -> list[str]:
    """Send each host with a deployment target of the models ``model_pks`` names their keys as they are now
    (``keys_payload``). Idempotent: a repeat sends the same keys.

    Returns:
        The names of the hosts sent a payload, sorted.
    """
    targets = (DeploymentTarget.objects.filter(deployment__model__in=model_pks)
               .select_related("host", "deployment__model"))
    by_host: dict[int, tuple[ServingHost, dict[str, str]]] = {}
    for target in targets:
        host, names = by_host.setdefault(target.host_id, (target.host, {}))
        names[target.runtime_name] = target.deployment.model.name
    for host, names in by_host.values():
        send_to_host(host.name, AgentTask.KEYS, keys_payload(host, names))
    return sorted(host.name for host, _ in by_host.values())


def on_inference_keys_changed(sender, models, **kwargs) -> None:
    """Receiver of ``registry.signals.inference_keys_changed``: ``send_inference_keys`` of ``models`` (a list of
    RegisteredModel) once the transaction commits, so the payloads hold the committed keys."""
    model_pks = [model.pk for model in models]
    transaction.on_commit(lambda: send_inference_keys(model_pks), robust=True)

