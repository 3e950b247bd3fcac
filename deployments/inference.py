"""Try it: one inference request to a deployed model version on a chosen host, timed.

Two routes, chosen by ``TRY_IT_ROUTE`` (``MODELYARD_TRY_IT_ROUTE``):

- ``agent`` (the default): the request travels over the broker to the host's agent
  (``contract.AgentTask.INFER``), which sends it to its runtime and answers on a reply list in the
  broker. The web tier needs to reach only the broker, as in the production topology, where the
  serving hosts sit on a network of their own (docker-compose's ``serving``).
- ``direct``: the web tier sends the request to the host's ``inference_url`` itself; for a web tier
  documented to reach the serving network.

Both run ``modelyard_agent.inference.infer``; the latency reported is the runtime's round trip
measured where the request was sent from (on the host, for the agent route), and ``route_ms`` the
whole call as the web tier saw it.
"""

import json
import time
import uuid

from django.conf import settings
from django.utils import timezone

from deployments.enqueue import send_to_host
from deployments.hosts import get_host
from deployments.lifecycle import serving_target
from deployments.served import host_served_name
from modelyard.celery import broker
from modelyard.errors import InvalidInput, ServiceUnavailable
from modelyard_agent.contract import AgentTask
from modelyard_agent.inference import InferenceRefused, infer
from registry.versions import get_version

TRY_TIMEOUT_S = 10.0  # the host's own timeout for one Try it request, seconds
BROKER_MARGIN_S = 5.0  # beyond it, for the broker both ways and the agent taking the task, seconds


def try_inference(*, model_name: str, host_name: str, inputs: dict, version: int | None = None) -> dict:
    """Send ``inputs`` to the model on one host and time it.

    Args:
        model_name: the registered model.
        host_name: a serving host.
        inputs: ``{input name: nested list}`` including the batch dimension; data types come
            from the version's signature.
        version: the version to ask for; None lets the host answer with the one it serves.

    Returns:
        ``{"host", "model", "version", "outputs": {name: nested list}, "shapes": {name: [int]},
        "latency_ms": float, "route": "agent" | "direct", "route_ms": float}``; latency is the
        runtime's round trip in milliseconds, ``route_ms`` the whole call from the web tier.

    Raises:
        NotFound: unknown model, host or version, or nothing deployed there.
        InvalidInput: inputs that do not fit the signature, or that the runtime refused.
        ServiceUnavailable: the host (or its agent) did not answer, or the version is not ready there. On
            the agent route, a host whose agent has not reported within ``HOST_OFFLINE_AFTER`` seconds is
            refused at once instead of after the reply's timeout (nothing would take the task).
    """
    host = get_host(host_name)
    if version:
        model_version = get_version(model_name, version)
        served_name = host_served_name(host, model_version.model)
    else:
        target = serving_target(host_name, model_name)
        model_version, served_name = target.deployment.version, target.runtime_name
    request = {
        "runtime": host.runtime, "inference_url": host.inference_url, "model": served_name,
        "version": model_version.version, "pin_version": bool(version), "inputs": inputs,
        "signature": model_version.signature or {}, "timeout": TRY_TIMEOUT_S,
    }
    route = settings.TRY_IT_ROUTE
    started = time.perf_counter()
    if route == "direct":
        try:
            result = infer(**request)
        except InferenceRefused as exc:
            raise (ServiceUnavailable if exc.retryable else InvalidInput)(f"{host.name}: {exc.message}") from exc
    else:
        if not host.agent_is_reporting():
            raise ServiceUnavailable(_silent_agent(host))
        result = _through_agent(host.name, request)
    route_ms = round((time.perf_counter() - started) * 1000, 3)
    return {"host": host.name, "model": model_name, **result, "route": route, "route_ms": route_ms}


def _silent_agent(host) -> str:
    """Why Try it does not send a task to ``host``'s agent: when it last reported, if ever."""
    if host.last_heartbeat_at is None:
        return f"{host.name}: its agent has never reported (is it running?)"
    age = (timezone.now() - host.last_heartbeat_at).total_seconds()
    return (f"{host.name}: its agent last reported {age:.0f} s ago, more than {settings.HOST_OFFLINE_AFTER:g} s "
            "(is it running?)")


def _through_agent(host: str, request: dict) -> dict:
    """Send the request to ``host``'s agent and wait for its reply on a list of the broker's."""

    reply_to = f"modelyard:try-it:{uuid.uuid4().hex}"
    wait = TRY_TIMEOUT_S + BROKER_MARGIN_S
    send_to_host(host, AgentTask.INFER, {**request, "host": host, "reply_to": reply_to}, expires=wait)
    client = broker(socket_timeout=wait + 5)
    try:
        answer = client.blpop([reply_to], timeout=wait)
    finally:
        client.delete(reply_to)
    if answer is None:
        raise ServiceUnavailable(f"{host}: its agent did not answer within {wait:g} s (is it running, "
                                 "or busy with long loads?)")
    reply = json.loads(answer[1])
    if not reply.pop("ok"):
        raise (ServiceUnavailable if reply.get("retryable") else InvalidInput)(f"{host}: {reply['error']}")
    return reply
