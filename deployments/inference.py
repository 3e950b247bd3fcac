"""Try it: one inference request to a deployed model version on a chosen host, timed."""

import time

import numpy as np
import requests

from deployments.choices import Runtime
from deployments.lifecycle import serving_target
from deployments.services import get_host
from modelyard.errors import InvalidInput, ServiceUnavailable
from modelyard_agent.formats.triton_config import ModelConfigError, sample_arrays
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.triton import TritonRuntime
from registry.services import get_version

TRY_TIMEOUT_S = 10.0
MAX_OUTPUT_VALUES = 10_000


def try_inference(*, model_name: str, host_name: str, inputs: dict, version: int | None = None) -> dict:
    """Send ``inputs`` to the model on one host (tritonclient, or JSON to a BentoML host's API route) and time it.

    Args:
        model_name: the registered model.
        host_name: a serving host.
        inputs: ``{input name: nested list}`` including the batch dimension; data types come
            from the version's signature.
        version: the version to ask for; None lets the host answer with the one it serves.

    Returns:
        ``{"host", "model", "version", "outputs": {name: nested list}, "shapes": {name: [int]},
        "latency_ms": float}``; latency is the client-side round trip in milliseconds.

    Raises:
        NotFound: unknown model, host or version, or nothing deployed there.
        InvalidInput: inputs that do not fit the signature, or that Triton refused.
        ServiceUnavailable: the host did not answer, or the version is not ready there.
    """
    host = get_host(host_name)
    if version:
        model_version = get_version(model_name, version)
    else:
        model_version = serving_target(host_name, model_name).deployment.version
    if host.runtime == Runtime.BENTOML:
        return _try_bentoml(host, model_version, inputs)
    try:
        arrays = sample_arrays(inputs, model_version.signature)
    except ModelConfigError as exc:
        raise InvalidInput(str(exc)) from exc
    outputs = [o["name"] for o in model_version.signature.get("outputs", [])]
    runtime = TritonRuntime(host.inference_url, timeout=TRY_TIMEOUT_S)
    started = time.perf_counter()
    try:
        result = runtime.infer(model_name, arrays, outputs, version=version)
    except ServingRuntimeError as exc:
        raise (ServiceUnavailable if exc.retryable else InvalidInput)(f"{host.name}: {exc.message}") from exc
    latency_ms = (time.perf_counter() - started) * 1000
    too_big = [name for name, array in result.items() if array.size > MAX_OUTPUT_VALUES]
    if too_big:
        raise InvalidInput(f"outputs {too_big} hold more than {MAX_OUTPUT_VALUES} values; send a smaller batch")
    return {
        "host": host.name, "model": model_name, "version": model_version.version,
        "outputs": {name: _jsonable(array) for name, array in result.items()},
        "shapes": {name: list(array.shape) for name, array in result.items()},
        "latency_ms": round(latency_ms, 3),
    }


def _try_bentoml(host, model_version, inputs: dict) -> dict:
    """Try it on a BentoML host: POST ``inputs`` as JSON to the Bento's first API route through the
    host's nginx (``/<model>/<route>``); the answer must come from ``model_version``."""
    apis = ((model_version.signature or {}).get("bentoml") or {}).get("apis") or []
    if not apis:
        raise InvalidInput(f"{model_version.model.name} v{model_version.version} declares no BentoML API route")
    route = apis[0].get("route") or f"/{apis[0]['name']}"
    url = f"{host.inference_url}/{model_version.model.name}{route}"
    started = time.perf_counter()
    try:
        answer = requests.post(url, json=inputs, timeout=TRY_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ServiceUnavailable(f"{host.name}: {exc}") from exc
    latency_ms = (time.perf_counter() - started) * 1000
    if answer.status_code >= 500:
        raise ServiceUnavailable(f"{host.name}: HTTP {answer.status_code}: {answer.text[:300]}")
    if answer.status_code != 200:
        raise InvalidInput(f"{host.name}: HTTP {answer.status_code}: {answer.text[:300]}")
    served = answer.headers.get("X-Modelyard-Version")
    if served != str(model_version.version):
        raise ServiceUnavailable(f"{host.name} answered from version {served}, not {model_version.version}")
    try:
        output = answer.json()
    except ValueError:
        output = answer.text
    return {
        "host": host.name, "model": model_version.model.name, "version": model_version.version,
        "outputs": {"output": output}, "shapes": {"output": list(np.shape(output)) if isinstance(output, list) else []},
        "latency_ms": round(latency_ms, 3),
    }


def _jsonable(array) -> list:
    """Nested lists of an output tensor; BYTES elements decoded as UTF-8 (invalid bytes replaced);
    NaN and ±infinity (which JSON cannot carry) as null."""
    import numpy as np

    if array.dtype.kind == "f" and not np.isfinite(array).all():
        values = array.astype(object)
        values[~np.isfinite(array)] = None
        return values.tolist()
    if array.dtype == object or array.dtype.kind == "S":
        return [_jsonable(a) if getattr(a, "ndim", 0) else (a.decode(errors="replace") if isinstance(a, bytes) else a)
                for a in array]
    return array.tolist()
