"""Adapter for NVIDIA Triton Inference Server over its HTTP/REST API (KServe v2).

The only module that talks to Triton through ``tritonclient``. Every call opens
a short-lived client with explicit connection and network timeouts, so one
TritonRuntime can be shared between threads, and maps every failure onto
ServingRuntimeError: retryable for connection errors, timeouts and 408/429/5xx
answers that mean "busy or unavailable", not retryable when Triton refused the
request (bad config, model failed to initialise, unknown model).

Triton must run with ``--model-control-mode=explicit`` for load and unload.
"""

import http.client
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import gevent
import numpy as np
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from modelyard_agent.runtimes.base import ModelVersionState, ServingRuntimeError

# Statuses that mean "not now" rather than "no".
_RETRYABLE_STATUSES = {"408", "429", "502", "503", "504"}
_GONE_STATES = {"READY", "UNLOADING"}


class TritonRuntime:
    """One Triton server, reached at its HTTP endpoint.

    Args:
        inference_url: base URL of Triton's HTTP endpoint, e.g.
            ``http://127.0.0.1:8000`` (``https://`` is supported; a path prefix
            is kept; a bare ``host:port`` means http).
        timeout: seconds allowed to connect and then for each network read of
            an ordinary call.
        load_timeout: seconds allowed for a blocking ``load`` call, which lasts
            as long as Triton takes to initialise the model; defaults to
            ``timeout``.
        grpc_url: ``host:port`` of the same server's gRPC endpoint; when given, ``load`` and
            ``unload`` go there. Triton 2.51's HTTP endpoint runs a load on the HTTP worker
            thread that received it, and every keep-alive client connection that thread
            serves stalls until the load ends (measured: an inference request on such a
            connection waited out a 15 s load); its gRPC endpoint handles model control apart
            from inference, so clients of either protocol keep being answered.

    Raises:
        ValueError: the URL has a scheme other than http/https or no host, the gRPC URL is not
            ``host:port``, or a timeout is not positive.
    """

    def __init__(self, inference_url: str, timeout: float = 10.0, *, load_timeout: float | None = None,
                 grpc_url: str = ""):
        if "://" not in inference_url:
            inference_url = f"http://{inference_url}"
        parts = urlsplit(inference_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"Triton inference_url must be http(s)://host:port, got {inference_url!r}")
        if timeout <= 0 or (load_timeout is not None and load_timeout <= 0):
            raise ValueError("Triton timeouts must be positive numbers of seconds")
        self.inference_url = inference_url
        self.timeout = float(timeout)
        self.load_timeout = float(load_timeout) if load_timeout is not None else self.timeout
        self._address = parts.netloc + parts.path.rstrip("/")
        self._ssl = parts.scheme == "https"
        grpc_url = grpc_url.removeprefix("grpc://")
        if grpc_url and (urlsplit(f"//{grpc_url}").port is None or "/" in grpc_url):
            raise ValueError(f"Triton grpc_url must be host:port, got {grpc_url!r}")
        self.grpc_url = grpc_url

    def __repr__(self) -> str:
        return f"TritonRuntime({self.inference_url!r}, timeout={self.timeout})"

    @contextmanager
    def _client(self, action: str, timeout: float | None = None) -> Iterator[triton_http.InferenceServerClient]:
        """Yield a fresh client; translate its failures into ServingRuntimeError."""
        seconds = timeout if timeout is not None else self.timeout
        try:
            client = triton_http.InferenceServerClient(
                self._address,
                connection_timeout=seconds,
                network_timeout=seconds,
                ssl=self._ssl,
            )
        except InferenceServerException as exc:
            raise ServingRuntimeError(f"{action}: {exc.message()}", retryable=False) from exc
        try:
            yield client
        except InferenceServerException as exc:
            status = exc.status() or ""
            raise ServingRuntimeError(exc.message(), retryable=status in _RETRYABLE_STATUSES) from exc
        except (TimeoutError, gevent.Timeout) as exc:
            raise ServingRuntimeError(
                f"{action}: Triton at {self.inference_url} did not answer within {seconds:g} s",
                retryable=True, timed_out=True,
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            detail = str(exc) or type(exc).__name__
            raise ServingRuntimeError(
                f"{action}: cannot reach Triton at {self.inference_url} within {seconds:g} s: {detail}",
                retryable=True,
            ) from exc
        finally:
            client.close()

    @contextmanager
    def _grpc_client(self, action: str, timeout: float) -> Iterator[triton_grpc.InferenceServerClient]:
        """Yield a fresh gRPC client; translate its failures as ``_client`` does."""
        client = triton_grpc.InferenceServerClient(self.grpc_url)
        try:
            yield client
        except InferenceServerException as exc:
            status = exc.status() or ""
            if status == "StatusCode.DEADLINE_EXCEEDED":
                raise ServingRuntimeError(
                    f"{action}: Triton at {self.grpc_url} (gRPC) did not answer within {timeout:g} s",
                    retryable=True, timed_out=True,
                ) from exc
            if status == "StatusCode.UNAVAILABLE":
                raise ServingRuntimeError(f"{action}: cannot reach Triton's gRPC endpoint {self.grpc_url}: "
                                          f"{exc.message()}", retryable=True) from exc
            raise ServingRuntimeError(exc.message(), retryable=False) from exc
        finally:
            client.close()

    def is_live(self) -> bool:
        """Ask Triton whether it is live (GET /v2/health/live).

        Returns:
            True when Triton answers 200; False when it answers otherwise or
            cannot be reached within ``timeout``.

        Raises:
            Nothing: an unreachable server is reported as not live.
        """
        try:
            with self._client("check liveness") as client:
                return bool(client.is_server_live())
        except ServingRuntimeError:
            return False

    def server_version(self) -> str:
        """Return Triton's version string (GET /v2), e.g. ``"2.51.0"``.

        Raises:
            ServingRuntimeError: Triton is unreachable (retryable) or refused.
        """
        with self._client("read server metadata") as client:
            return str(client.get_server_metadata().get("version", ""))

    def repository_index(self) -> list[ModelVersionState]:
        """List every model version in Triton's model repository (POST /v2/repository/index).

        Returns:
            One ModelVersionState per (model, version) Triton reports; a model
            that was never loaded appears once with version None and empty state.

        Raises:
            ServingRuntimeError: Triton is unreachable (retryable) or refused
                (not retryable, e.g. model control mode is not explicit).
        """
        with self._client("read the model repository index") as client:
            entries = client.get_model_repository_index()
        states = []
        for entry in entries:
            version = entry.get("version")
            states.append(
                ModelVersionState(
                    name=str(entry.get("name", "")),
                    version=int(version) if version not in (None, "") else None,
                    state=str(entry.get("state", "")),
                    reason=str(entry.get("reason", "")),
                )
            )
        return states

    def ready_versions(self, model: str) -> list[int]:
        """Return the versions of ``model`` that are READY, ascending (empty if none).

        Raises:
            ServingRuntimeError: as repository_index.
        """
        return sorted(
            entry.version
            for entry in self.repository_index()
            if entry.name == model and entry.version is not None and entry.state == "READY"
        )

    def load(self, model: str, config_json: str | None) -> None:
        """Load or reload ``model`` with a config override (POST /v2/repository/models/<model>/load), or with
        the ``config.pbtxt`` of its model repository folder when ``config_json`` is None.

        Blocks until Triton has finished loading (up to ``load_timeout``
        seconds). The versions named by the config's version policy are
        loaded; versions no longer named are unloaded afterwards. When a
        reload fails, Triton keeps serving the versions it had.

        Args:
            model: model name, a folder in Triton's model repository.
            config_json: the full model config as protobuf JSON (see
                ``triton_config.render_load_config``).

        Raises:
            ServingRuntimeError: Triton refused or the model failed to load
                (not retryable; the message is Triton's, e.g. ``load failed for
                model 'iris': version 2 is at UNAVAILABLE state: ...``), or Triton
                is unreachable (retryable), or did not finish within ``load_timeout``
                (retryable, ``timed_out``; the load goes on on the server, and Triton
                holds every later load or unload of this model until it ends).
        """
        action = f"load model {model!r}"
        if self.grpc_url:
            with self._grpc_client(action, self.load_timeout) as client:
                client.load_model(model, config=config_json, client_timeout=self.load_timeout)
            return
        with self._client(action, timeout=self.load_timeout) as client:
            client.load_model(model, config=config_json)

    def unload(self, model: str) -> None:
        """Ask Triton to unload every version of ``model`` (POST .../unload).

        Triton answers before the versions are gone: in-flight requests finish
        first. Use wait_versions_gone to wait for that. Unloading a model that
        is not loaded succeeds.

        Raises:
            ServingRuntimeError: Triton is unreachable (retryable) or refused.
        """
        action = f"unload model {model!r}"
        if self.grpc_url:
            with self._grpc_client(action, self.load_timeout) as client:
                client.unload_model(model, client_timeout=self.load_timeout)
            return
        with self._client(action, timeout=self.load_timeout) as client:
            client.unload_model(model)

    def is_version_ready(self, model: str, version: int) -> bool:
        """Return True when ``version`` of ``model`` is ready (GET /v2/models/<model>/versions/<version>/ready).

        Returns:
            False when Triton answers anything but 200, including for an
            unknown model or version.

        Raises:
            ServingRuntimeError: Triton is unreachable (retryable).
        """
        with self._client(f"check readiness of {model!r} version {version}") as client:
            return bool(client.is_model_ready(model, model_version=str(version)))

    def wait_versions_gone(self, model: str, versions: list[int], timeout: float, poll: float = 0.05) -> None:
        """Block until none of ``versions`` of ``model`` is READY or UNLOADING.

        Args:
            model: model name.
            versions: version numbers to wait for.
            timeout: seconds to wait in total.
            poll: seconds between two reads of the repository index (one small local HTTP
                call; the wait ends every swap, so a coarse poll adds to each deployment).

        Raises:
            ServingRuntimeError: still serving or unloading after ``timeout``
                seconds (retryable), or the index cannot be read.
        """
        waiting_for = set(versions)
        deadline = time.monotonic() + timeout
        while True:
            remaining = sorted(
                entry.version
                for entry in self.repository_index()
                if entry.name == model and entry.version in waiting_for and entry.state in _GONE_STATES
            )
            if not remaining:
                return
            if time.monotonic() >= deadline:
                raise ServingRuntimeError(
                    f"model {model!r} versions {remaining} still loaded or unloading after {timeout:g} s",
                    retryable=True,
                )
            time.sleep(poll)

    def infer(
        self,
        model: str,
        inputs: dict[str, np.ndarray],
        outputs: list[str],
        version: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Run one inference request (POST /v2/models/<model>[/versions/<v>]/infer).

        Args:
            model: model name.
            inputs: input tensors by name; each array's dtype gives the Triton
                data type (float32 -> FP32, int64 -> INT64, ...) and its shape
                includes the batch dimension for a batching model.
            outputs: names of the outputs to return.
            version: the version to run; None lets Triton pick (the highest ready).

        Returns:
            The requested outputs by name, as numpy arrays.

        Raises:
            ServingRuntimeError: Triton refused the request, e.g. unknown model
                or wrong shape (not retryable); the version is known but not
                ready, which Triton answers with 503 as it may be loading
                (retryable); or Triton is unreachable (retryable).
        """
        request_inputs = []
        for name, array in inputs.items():
            array = np.ascontiguousarray(array)
            tensor = triton_http.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            request_inputs.append(tensor)
        requested = [triton_http.InferRequestedOutput(name) for name in outputs]
        with self._client(f"infer on {model!r}") as client:
            result = client.infer(
                model,
                request_inputs,
                model_version="" if version is None else str(version),
                outputs=requested,
            )
        return {name: result.as_numpy(name) for name in outputs}


@dataclass(frozen=True)
class MemoryInUse:
    """Memory a Triton server reports in use, in bytes.

    ``gpu_bytes`` sums ``nv_gpu_memory_used_bytes`` over every GPU (None without GPUs);
    ``cpu_bytes`` is ``nv_cpu_memory_used_bytes`` (the whole host's, so noisier);
    ``gpus`` lists ``{"gpu_uuid", "memory_used", "memory_total"}`` per GPU.
    """

    gpu_bytes: int | None
    cpu_bytes: int | None
    gpus: tuple = ()


def read_memory_in_use(metrics_url: str, timeout: float = 5.0) -> MemoryInUse:
    """Read the memory gauges from Triton's Prometheus endpoint.

    Args:
        metrics_url: e.g. ``http://gpu-0:8002/metrics``.
        timeout: seconds for the request.

    Returns:
        The gauges, parsed with prometheus_client's exposition parser.

    Raises:
        ServingRuntimeError: the endpoint cannot be read (retryable).
    """
    try:
        answer = requests.get(metrics_url, timeout=timeout)
        answer.raise_for_status()
    except requests.RequestException as exc:
        raise ServingRuntimeError(f"cannot read Triton metrics at {metrics_url}: {exc}", retryable=True) from exc
    gpu, cpu = None, None
    gpus: dict[str, dict] = {}
    for family in text_string_to_metric_families(answer.text):
        if family.name in ("nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"):
            field = "memory_used" if family.name.endswith("used_bytes") else "memory_total"
            for sample in family.samples:
                uuid = sample.labels.get("gpu_uuid", "")
                gpus.setdefault(uuid, {"gpu_uuid": uuid})[field] = int(sample.value)
            if field == "memory_used":
                gpu = int(sum(sample.value for sample in family.samples))
        elif family.name == "nv_cpu_memory_used_bytes" and family.samples:
            cpu = int(family.samples[0].value)
    return MemoryInUse(gpu_bytes=gpu, cpu_bytes=cpu, gpus=tuple(gpus[k] for k in sorted(gpus)))


@dataclass(frozen=True)
class RawAnswer:
    """Triton's answer to one raw inference request: HTTP status, the ``Inference-Header-Content-Length``
    header (None when absent), the body, and the round trip in milliseconds (request written to body read)."""

    status: int
    header_length: int | None
    body: bytes
    latency_ms: float


class RawInferClient:
    """Sends request bodies as they are to ``POST /v2/models/<model>/versions/<v>/infer`` over one keep-alive
    HTTP connection (KServe v2 HTTP, with Triton's binary tensor extension passed through untouched).

    One request at a time (not thread-safe); a broken connection is opened again on the next request.

    Args:
        base_url: Triton's own HTTP URL (``http://host:port``), not the gateway's.
        timeout: seconds to connect and for each read.
    """

    def __init__(self, base_url: str, timeout: float = 10.0):
        parts = urlsplit(base_url)
        self._host, self._port, self._timeout = parts.hostname or "127.0.0.1", parts.port or 80, timeout
        self._connection: http.client.HTTPConnection | None = None

    def close(self) -> None:
        """Close the connection (a later request opens a new one)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def infer(self, model: str, version: int, body: bytes, headers: dict[str, str]) -> RawAnswer:
        """Send ``body`` with ``headers`` (Content-Type, Inference-Header-Content-Length) to one version.

        Returns:
            The answer, whatever its status (a 400 is Triton refusing this input, not an error here).

        Raises:
            ServingRuntimeError: Triton could not be reached, or did not answer within the timeout
                (retryable), after one fresh connection was tried.
        """
        path = f"/v2/models/{model}/versions/{int(version)}/infer"
        for attempt in (1, 2):
            if self._connection is None:
                self._connection = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            started = time.perf_counter()
            try:
                self._connection.request("POST", path, body=body, headers={**headers, "Connection": "keep-alive"})
                response = self._connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == 2 or isinstance(exc, TimeoutError):
                    raise ServingRuntimeError(f"inference on {model!r} v{version} failed: {exc}", retryable=True,
                                              timed_out=isinstance(exc, TimeoutError)) from exc
                continue
            latency_ms = (time.perf_counter() - started) * 1000
            length = response.getheader("Inference-Header-Content-Length")
            if response.getheader("Connection", "").lower() == "close":
                self.close()
            return RawAnswer(response.status, int(length) if length and length.isdigit() else None, data, latency_ms)
        raise AssertionError("unreachable")
