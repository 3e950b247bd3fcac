"""One inference request to a model on this host's runtime, timed: the host side of "Try it".

The agent runs it when the orchestrator sends ``contract.AgentTask.INFER`` (the web tier need not
reach the serving network), and the web tier runs the same code itself when it is configured to
reach the hosts directly (``MODELYARD_TRY_IT_ROUTE=direct``).
"""

from __future__ import annotations

import time

import numpy as np
import requests

from modelyard_agent.contract import Runtime
from modelyard_agent.formats.triton_config import ModelConfigError, sample_arrays
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.triton import TritonRuntime

MAX_OUTPUT_VALUES = 10_000
VERSION_HEADER = "X-Modelyard-Version"  # which version of a model a BentoML host's nginx routed to


class InferenceRefused(Exception):
    """The request could not be answered.

    Attributes:
        message: why, naming the host's answer.
        retryable: True when the runtime was unreachable or not ready (try again later), False
            when it refused the inputs.
    """

    def __init__(self, message: str, *, retryable: bool):
        super().__init__(message)
        self.message = message
        self.retryable = retryable


def infer(*, runtime: str, inference_url: str, model: str, version: int, pin_version: bool, inputs: dict,
          signature: dict, timeout: float) -> dict:
    """Send ``inputs`` to ``model`` on this host's runtime and time the round trip.

    Args:
        runtime: a ``contract.Runtime`` value.
        inference_url: the runtime's HTTP endpoint (a BentoML host: its nginx).
        model: the model's name on the runtime.
        version: the version expected to answer.
        pin_version: ask Triton for ``version`` itself (else it answers with the one it serves).
        inputs: ``{input name: nested list}``, including the batch dimension.
        signature: the version's signature: input and output names and data types (Triton), or
            ``{"bentoml": {"apis": [{"name", "route"}]}}`` (BentoML: the first API route is used).
        timeout: seconds for the request.

    Returns:
        ``{"version": int, "outputs": {name: nested list}, "shapes": {name: [int]}, "latency_ms":
        float}``: the latency is the request's round trip from this process, in milliseconds.

    Raises:
        InferenceRefused: inputs that do not fit the signature, an answer that is an error, an
            output over ``MAX_OUTPUT_VALUES`` values, or a runtime that cannot be reached.
    """
    if runtime == Runtime.BENTOML:
        return _infer_bentoml(inference_url, model, version, inputs, signature, timeout)
    try:
        arrays = sample_arrays(inputs, signature)
    except ModelConfigError as exc:
        raise InferenceRefused(str(exc), retryable=False) from exc
    outputs = [o["name"] for o in signature.get("outputs", [])]
    client = TritonRuntime(inference_url, timeout=timeout)
    started = time.perf_counter()
    try:
        result = client.infer(model, arrays, outputs, version=version if pin_version else None)
    except ServingRuntimeError as exc:
        raise InferenceRefused(exc.message, retryable=exc.retryable) from exc
    latency_ms = (time.perf_counter() - started) * 1000
    too_big = [name for name, array in result.items() if array.size > MAX_OUTPUT_VALUES]
    if too_big:
        raise InferenceRefused(f"outputs {too_big} hold more than {MAX_OUTPUT_VALUES} values; send a smaller batch",
                               retryable=False)
    return {"version": version, "outputs": {name: jsonable(array) for name, array in result.items()},
            "shapes": {name: list(array.shape) for name, array in result.items()}, "latency_ms": round(latency_ms, 3)}


def _infer_bentoml(inference_url: str, model: str, version: int, inputs: dict, signature: dict,
                   timeout: float) -> dict:
    """POST ``inputs`` as JSON to the Bento's first API route through the host's nginx
    (``/<model>/<route>``); the answer must come from ``version``."""
    apis = ((signature or {}).get("bentoml") or {}).get("apis") or []
    if not apis:
        raise InferenceRefused(f"{model} v{version} declares no BentoML API route", retryable=False)
    route = apis[0].get("route") or f"/{apis[0]['name']}"
    started = time.perf_counter()
    try:
        answer = requests.post(f"{inference_url}/{model}{route}", json=inputs, timeout=timeout)
    except requests.RequestException as exc:
        raise InferenceRefused(str(exc), retryable=True) from exc
    latency_ms = (time.perf_counter() - started) * 1000
    if answer.status_code != 200:
        raise InferenceRefused(f"HTTP {answer.status_code}: {answer.text[:300]}", retryable=answer.status_code >= 500)
    served = answer.headers.get(VERSION_HEADER)
    if served != str(version):
        raise InferenceRefused(f"answered from version {served}, not {version}", retryable=True)
    try:
        output = answer.json()
    except ValueError:
        output = answer.text
    return {"version": version, "outputs": {"output": output},
            "shapes": {"output": list(np.shape(output)) if isinstance(output, list) else []},
            "latency_ms": round(latency_ms, 3)}


def jsonable(array: np.ndarray) -> list:
    """Nested lists of an output tensor; BYTES elements decoded as UTF-8 (invalid bytes replaced);
    NaN and ±infinity (which JSON cannot carry) as null."""
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        values = array.astype(object)
        values[~np.isfinite(array)] = None
        return values.tolist()
    if array.dtype == object or array.dtype.kind == "S":
        return [jsonable(a) if getattr(a, "ndim", 0) else (a.decode(errors="replace") if isinstance(a, bytes) else a)
                for a in array]
    return array.tolist()
