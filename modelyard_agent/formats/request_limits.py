"""The most bytes an infer request body to a Triton model may hold, derived from its signature.

The host's gateway refuses a longer body with 413 before Triton sees it (``runtimes/modelyard_limits.lua``):
older tritonservers crash on oversized or crafted bodies (SECURITY.md), and every model of the host goes
down with them. The bound follows the KServe v2 protocol as Triton speaks it (the ``binary_tensor_data``
extension of triton-inference-server/server, docs/protocol/extension_binary_data.md):

- a request with binary tensors holds a JSON header, then each input's raw bytes: ``max_batch_size`` (1
  for a model without batching) × the product of its ``dims`` × its data type's size;
- a JSON request writes each element as a number, at most ``JSON_BYTES_PER_ELEMENT`` characters with
  its separator (``-1.2345678901234567e-308,`` is 25);

so the limit is the larger of the two, plus ``ENVELOPE_BYTES`` for the request around the tensors and
``BYTES_PER_INPUT`` for each input's name, shape and parameters. A model with a variable dimension (-1)
or a ``TYPE_STRING`` (BYTES) input has no such bound: it takes the host's default, and a deployment may set
its own (``max_request_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig

from modelyard_agent.formats.triton_config import _apply_overrides, parse_model_config

# Bytes per element of each fixed-size data type (Triton's model_config.proto).
DATA_TYPE_BYTES = {
    DataType.TYPE_BOOL: 1, DataType.TYPE_UINT8: 1, DataType.TYPE_INT8: 1,
    DataType.TYPE_UINT16: 2, DataType.TYPE_INT16: 2, DataType.TYPE_FP16: 2, DataType.TYPE_BF16: 2,
    DataType.TYPE_UINT32: 4, DataType.TYPE_INT32: 4, DataType.TYPE_FP32: 4,
    DataType.TYPE_UINT64: 8, DataType.TYPE_INT64: 8, DataType.TYPE_FP64: 8,
}
JSON_BYTES_PER_ELEMENT = 32
ENVELOPE_BYTES = 16 * 1024
BYTES_PER_INPUT = 1024


@dataclass(frozen=True)
class RequestLimit:
    """A model's request body limit: ``bytes``, and ``basis``, one of ``"signature"`` (derived from
    fixed dims), ``"deployment"`` (set by its deployment), ``"host"`` (the host's default: a variable
    dimension or BYTES input, or a derived bound above the host's)."""

    bytes: int
    basis: str


def signature_bound(cfg: ModelConfig) -> int | None:
    """The most bytes an infer request of ``cfg``'s signature holds (see the module's notes), or None when
    an input has a variable dimension or a data type of no fixed size."""
    batch = max(1, cfg.max_batch_size)
    binary = json = 0
    for tensor in cfg.input:
        size = DATA_TYPE_BYTES.get(tensor.data_type)
        if size is None or any(dim < 0 for dim in tensor.dims):
            return None
        elements = batch * math.prod(tensor.dims)
        binary += elements * size
        json += elements * JSON_BYTES_PER_ELEMENT
    return max(binary, json) + ENVELOPE_BYTES + BYTES_PER_INPUT * len(cfg.input)


def request_limit(config_text: str, *, overrides: dict | None, host_default: int,
                  deployment_limit: int | None = None) -> RequestLimit:
    """The body limit of a model served with ``config_text`` (``config.pbtxt``) and the deployment's
    ``overrides`` (its ``max_batch_size`` counts): the deployment's own ``deployment_limit`` (bytes) when
    given, else the signature's bound, never above ``host_default`` (bytes), which the gateway's
    ``client_max_body_size`` enforces anyway.

    Raises:
        ModelConfigError: the config does not parse.
    """
    if deployment_limit:
        return RequestLimit(min(int(deployment_limit), host_default),
                            "deployment" if deployment_limit <= host_default else "host")
    cfg = parse_model_config(config_text)
    if overrides:
        _apply_overrides(cfg, {k: v for k, v in overrides.items() if k == "max_batch_size"})
    bound = signature_bound(cfg)
    if bound is None or bound > host_default:
        return RequestLimit(host_default, "host")
    return RequestLimit(bound, "signature")
