"""Comparing two KServe v2 inference responses output by output, and summing up a replay.

Responses are read as the KServe v2 / Triton HTTP protocol defines them
(https://kserve.github.io/website/latest/modelserving/data_plane/v2_protocol/ and Triton's binary
tensor data extension, docs/protocol/extension_binary_data.md): a JSON body
``{"model_name", "model_version", "id"?, "outputs": [{"name", "datatype", "shape", "data"?,
"parameters"?: {"binary_data_size": n}}]}``; with the binary extension the first
``Inference-Header-Content-Length`` bytes are that JSON and the outputs' raw bytes follow, in the
order of ``outputs``, each ``binary_data_size`` bytes long (little-endian numbers; BOOL one byte
per element; BYTES each element a 4-byte little-endian length then its bytes).

The rule per output (``compare_outputs``):

- INT*/UINT*/BOOL/BYTES: equal element by element;
- FP16/FP32/FP64 (and BF16): ``|a - b| <= atol + rtol * |b|`` element by element, ``a`` the
  candidate and ``b`` the serving version's value; that is ``numpy.isclose(a, b, rtol, atol)``
  (https://numpy.org/doc/stable/reference/generated/numpy.isclose.html), with ``equal_nan=True``:
  NaN agrees with NaN only, and an infinity only with the same infinity;
- an output named in ``argmax_outputs`` instead agrees when the index of the largest value over the
  last axis is the same on both sides (a score vector's class);
- an output missing on one side, a different shape, or a datatype of another kind disagrees.

Differences are reported whatever the rule: the largest absolute difference ``|a - b|`` and the
largest relative one ``|a - b| / |b|`` (over elements with ``b != 0``) across the numeric outputs,
None when nothing numeric was compared or a difference was not finite.
"""

from __future__ import annotations

import base64
import heapq
import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

FLOAT_TYPES = frozenset({"FP16", "FP32", "FP64", "BF16"})
EXACT_TYPES = frozenset({"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "BYTES"})
_NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
          "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
          "FP32": np.float32, "FP64": np.float64}
# Upper edges of the histogram of per-request max absolute differences; the last bucket is "above 1".
HISTOGRAM_EDGES = (0.0, 1e-9, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
DEFAULT_WORST = 10
DEFAULT_PREVIEW_BYTES = 2048


class ResponseError(ValueError):
    """A response body that is not a KServe v2 inference response; the message says what is wrong."""


@dataclass(frozen=True)
class Tolerances:
    """How close two float outputs must be, and which outputs are compared by argmax.

    Attributes:
        atol: absolute tolerance (same unit as the output), at least 0.
        rtol: relative tolerance (a fraction of the serving version's value), at least 0.
        argmax_outputs: names of outputs compared by the argmax over their last axis.
    """

    atol: float = 1e-5
    rtol: float = 1e-3
    argmax_outputs: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        """JSON form: ``{"atol", "rtol", "argmax_outputs": [names]}``."""
        return {"atol": self.atol, "rtol": self.rtol, "argmax_outputs": sorted(self.argmax_outputs)}

    @classmethod
    def from_dict(cls, data: dict | None) -> Tolerances:
        """The inverse of ``as_dict``; missing keys take the defaults.

        Raises:
            ValueError: a tolerance that is not a finite number of at least 0, or argmax outputs that
                are not a list of names.
        """
        data = data or {}
        atol, rtol = data.get("atol", cls.atol), data.get("rtol", cls.rtol)
        for name, value in (("atol", atol), ("rtol", rtol)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of at least 0; got {value!r}")
        names = data.get("argmax_outputs") or []
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) and n for n in names):
            raise ValueError(f"argmax_outputs must be a list of output names; got {names!r}")
        return cls(atol=float(atol), rtol=float(rtol), argmax_outputs=tuple(sorted(set(names))))


@dataclass(frozen=True)
class Tensor:
    """One output of a response: its KServe datatype, shape and values (a numpy array of that shape;
    BYTES as an object array of ``bytes``)."""

    datatype: str
    shape: tuple[int, ...]
    values: np.ndarray

    def preview(self, limit: int) -> dict:
        """JSON form with at most about ``limit`` bytes of values: ``{"datatype", "shape", "data":
        [first values, flattened], "truncated": bool}`` (BYTES values as text, or base64 when not UTF-8)."""
        flat = self.values.reshape(-1)
        data, used, truncated = [], 0, False
        for item in flat:
            value = _json_value(item)
            cost = len(json.dumps(value)) + 2
            if used + cost > limit:
                truncated = True
                break
            data.append(value)
            used += cost
        return {"datatype": self.datatype, "shape": list(self.shape), "data": data, "truncated": truncated}


def _json_value(item):
    if isinstance(item, bytes):
        try:
            return item.decode()
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(item).decode()
    if isinstance(item, np.bool_ | bool):
        return bool(item)
    if isinstance(item, np.integer):
        return int(item)
    value = float(item)
    return value if math.isfinite(value) else str(value)


def decode_response(body: bytes, header_length: int | None = None) -> dict[str, Tensor]:
    """Read a KServe v2 inference response into its outputs.

    Args:
        body: the response body as received.
        header_length: the ``Inference-Header-Content-Length`` response header (bytes of JSON before
            the binary outputs), or None for an all-JSON response.

    Returns:
        ``{output name: Tensor}``.

    Raises:
        ResponseError: the body is not such a response (bad JSON, no ``outputs``, data that does not
            fill the shape, binary sizes that do not add up).
    """
    if header_length is not None and not 0 <= header_length <= len(body):
        raise ResponseError(f"Inference-Header-Content-Length {header_length} is outside the body's {len(body)} bytes")
    head, rest = (body[:header_length], body[header_length:]) if header_length is not None else (body, b"")
    try:
        document = json.loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResponseError(f"the response is not JSON: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("outputs"), list):
        raise ResponseError("the response has no outputs list")
    outputs, offset = {}, 0
    for entry in document["outputs"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ResponseError("an output has no name")
        name, datatype = entry["name"], str(entry.get("datatype", ""))
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ResponseError(f"output {name!r} has no valid shape")
        size = (entry.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if header_length is None or not isinstance(size, int) or offset + size > len(rest):
                raise ResponseError(f"output {name!r}: binary_data_size {size!r} does not fit the body")
            values = _from_binary(name, datatype, shape, rest[offset:offset + size])
            offset += size
        else:
            values = _from_json(name, datatype, shape, entry.get("data"))
        outputs[name] = Tensor(datatype, tuple(shape), values)
    return outputs


def _count(shape: list[int]) -> int:
    return int(np.prod(shape)) if shape else 1


def _from_json(name: str, datatype: str, shape: list[int], data) -> np.ndarray:
    if data is None:
        raise ResponseError(f"output {name!r} has neither data nor binary_data_size")
    flat = np.asarray(data, dtype=object).reshape(-1) if isinstance(data, list) else np.asarray([data], dtype=object)
    if flat.size != _count(shape):
        raise ResponseError(f"output {name!r} has {flat.size} values for shape {shape}")
    if datatype == "BYTES":
        return np.array([v.encode() if isinstance(v, str) else bytes(v) for v in flat], dtype=object).reshape(shape)
    if datatype == "BF16":
        datatype = "FP32"
    if datatype not in _NUMPY:
        raise ResponseError(f"output {name!r} has unknown datatype {datatype!r}")
    try:
        return np.array(list(flat), dtype=_NUMPY[datatype]).reshape(shape)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ResponseError(f"output {name!r}: values are not {datatype}: {exc}") from exc


def _from_binary(name: str, datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    count = _count(shape)
    if datatype == "BYTES":
        items, offset = [], 0
        while offset < len(raw):
            if offset + 4 > len(raw):
                raise ResponseError(f"output {name!r}: a BYTES element's length is cut off")
            (length,) = struct.unpack_from("<I", raw, offset)
            items.append(raw[offset + 4:offset + 4 + length])
            offset += 4 + length
        if offset != len(raw) or len(items) != count:
            raise ResponseError(f"output {name!r} has {len(items)} BYTES elements for shape {shape}")
        return np.array(items, dtype=object).reshape(shape)
    if datatype == "BF16":  # the upper half of an IEEE float32
        if len(raw) != 2 * count:
            raise ResponseError(f"output {name!r}: {len(raw)} bytes for {count} BF16 values")
        halves = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return halves.view(np.float32).reshape(shape)
    if datatype not in _NUMPY:
        raise ResponseError(f"output {name!r} has unknown datatype {datatype!r}")
    dtype = np.dtype(_NUMPY[datatype]).newbyteorder("<")
    if len(raw) != dtype.itemsize * count:
        raise ResponseError(f"output {name!r}: {len(raw)} bytes for {count} {datatype} values")
    return np.frombuffer(raw, dtype=dtype).astype(_NUMPY[datatype]).reshape(shape)


@dataclass
class RequestComparison:
    """How one request's two responses compare.

    Attributes:
        agree: every output agreed.
        max_abs_diff: the largest ``|candidate - serving|`` over the numeric outputs; None when none
            was compared or a difference was not finite (NaN against a number, an infinity).
        max_rel_diff: the largest ``|candidate - serving| / |serving|`` over elements whose serving value
            is not 0; None as for ``max_abs_diff``.
        output: the first output (by name) that disagreed, or None.
        reason: why it disagreed, a sentence; empty when it agreed.
        nonfinite: a difference was not finite (NaN against a number, an infinity against another value).
    """

    agree: bool
    max_abs_diff: float | None = None
    max_rel_diff: float | None = None
    output: str | None = None
    reason: str = ""
    nonfinite: bool = False

    def as_dict(self) -> dict:
        """JSON form of every attribute."""
        return {"agree": self.agree, "max_abs_diff": self.max_abs_diff, "max_rel_diff": self.max_rel_diff,
                "output": self.output, "reason": self.reason, "nonfinite": self.nonfinite}


def compare_outputs(serving: dict[str, Tensor], candidate: dict[str, Tensor],
                    tolerances: Tolerances = Tolerances()) -> RequestComparison:
    """Compare one request's outputs (see the module's rule).

    Args:
        serving: the outputs of the version that serves (the reference, ``b``).
        candidate: the candidate's outputs (``a``).
        tolerances: atol, rtol and the argmax outputs.

    Returns:
        The comparison; the first disagreeing output by name is named, and the differences cover
        every output both sides hold.
    """
    abs_max, rel_max, finite = None, None, True
    first: tuple[str, str] | None = None
    for name in sorted(set(serving) | set(candidate)):
        if name not in candidate or name not in serving:
            side = "candidate" if name not in candidate else "serving version"
            first = first or (name, f"output {name!r} is missing from the {side}'s response")
            continue
        a, b = candidate[name], serving[name]
        verdict, diffs = _compare_one(name, a, b, tolerances)
        if diffs is not None:
            abs_d, rel_d = diffs
            if abs_d is None:
                finite = False
            else:
                abs_max = abs_d if abs_max is None else max(abs_max, abs_d)
                if rel_d is not None:
                    rel_max = rel_d if rel_max is None else max(rel_max, rel_d)
        if verdict:
            first = first or (name, verdict)
    if not finite:
        abs_max = rel_max = None
    if first is None:
        return RequestComparison(True, abs_max, rel_max, nonfinite=not finite)
    return RequestComparison(False, abs_max, rel_max, first[0], first[1], nonfinite=not finite)


def _compare_one(name: str, a: Tensor, b: Tensor, tolerances: Tolerances):
    """``(reason it disagrees or "", (max abs, max rel) or None)`` for one output; max abs None: not finite."""
    if a.shape != b.shape:
        return (f"output {name!r} has shape {list(a.shape)} on the candidate, {list(b.shape)} on the serving "
                "version"), None
    floats = a.datatype in FLOAT_TYPES and b.datatype in FLOAT_TYPES
    if not floats and a.datatype != b.datatype:
        return f"output {name!r} is {a.datatype} on the candidate, {b.datatype} on the serving version", None
    if a.datatype == "BYTES":
        same = bool(np.array_equal(a.values, b.values))
        return ("" if same else f"output {name!r} differs (BYTES must be equal)"), None
    av, bv = a.values.astype(np.float64), b.values.astype(np.float64)
    diffs = _differences(av, bv)
    if name in tolerances.argmax_outputs:
        if not a.shape or a.shape[-1] == 0:
            return f"output {name!r} has no last axis to take the argmax over", diffs
        same = bool(np.array_equal(np.argmax(av, axis=-1), np.argmax(bv, axis=-1)))
        return ("" if same else f"output {name!r}'s argmax over its last axis differs"), diffs
    if floats:
        close = np.isclose(av, bv, rtol=tolerances.rtol, atol=tolerances.atol, equal_nan=True)
        if close.all():
            return "", diffs
        return (f"output {name!r}: {int((~close).sum())} of {close.size} values differ by more than "
                f"atol {tolerances.atol:g} + rtol {tolerances.rtol:g} × |serving|"), diffs
    same = bool(np.array_equal(a.values, b.values))
    return ("" if same else f"output {name!r} differs ({a.datatype} must be equal)"), diffs


def _differences(a: np.ndarray, b: np.ndarray) -> tuple[float | None, float | None]:
    if a.size == 0:
        return 0.0, None
    both_nan = np.isnan(a) & np.isnan(b)
    same_inf = np.isinf(a) & (a == b)
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.where(both_nan | same_inf, 0.0, np.abs(a - b))
    if not np.isfinite(delta).all():
        return None, None
    nonzero = (b != 0) & np.isfinite(b)
    rel = float((delta[nonzero] / np.abs(b[nonzero])).max()) if nonzero.any() else None
    return float(delta.max()), rel


def _quantile(sorted_values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation between closest ranks (numpy's default method)."""
    if not sorted_values:
        return None
    return float(np.quantile(np.asarray(sorted_values), q))


@dataclass
class Summary:
    """What a replay found over its requests.

    Requests whose serving side failed cannot be judged and are counted as ``skipped``; a request
    whose candidate failed while the serving version answered is a disagreement.

    Attributes:
        worst_count: how many worst disagreements to keep.
        preview_bytes: the byte bound of each side's outputs in a kept disagreement.
    """

    worst_count: int = DEFAULT_WORST
    preview_bytes: int = DEFAULT_PREVIEW_BYTES
    compared: int = 0
    agreed: int = 0
    skipped: int = 0
    nonfinite: int = 0
    disagreed_outputs: dict[str, int] = field(default_factory=dict)
    _abs: list[float] = field(default_factory=list)
    _latency: dict[str, list[float]] = field(default_factory=lambda: {"serving": [], "candidate": []})
    _worst: list = field(default_factory=list)
    _order: int = 0

    def add(self, request_id: str, comparison: RequestComparison, serving: dict[str, Tensor] | None,
            candidate: dict[str, Tensor] | None, *, serving_ms: float | None = None,
            candidate_ms: float | None = None) -> None:
        """Count one compared request.

        Args:
            request_id: the captured request's id.
            comparison: ``compare_outputs``'s verdict (or a disagreement made for a failed candidate).
            serving, candidate: both sides' outputs, for the worst disagreements (None: the side failed).
            serving_ms, candidate_ms: each side's round trip, milliseconds.
        """
        self.compared += 1
        self.agreed += comparison.agree
        if comparison.nonfinite:
            self.nonfinite += 1
        elif comparison.max_abs_diff is not None:
            self._abs.append(comparison.max_abs_diff)
        for side, value in (("serving", serving_ms), ("candidate", candidate_ms)):
            if value is not None:
                self._latency[side].append(float(value))
        if comparison.agree:
            return
        if comparison.output:
            self.disagreed_outputs[comparison.output] = self.disagreed_outputs.get(comparison.output, 0) + 1
        self._order += 1
        severity = math.inf if comparison.max_abs_diff is None else comparison.max_abs_diff
        entry = (severity, -self._order, request_id, comparison, serving, candidate)
        if len(self._worst) < self.worst_count:
            heapq.heappush(self._worst, entry)
        elif self.worst_count and entry[:2] > self._worst[0][:2]:
            heapq.heapreplace(self._worst, entry)

    def skip(self) -> None:
        """Count a request the serving version did not answer (it cannot be judged)."""
        self.skipped += 1

    @property
    def agreement_rate(self) -> float | None:
        """Agreeing requests over compared ones (0..1), None before any was compared."""
        return self.agreed / self.compared if self.compared else None

    def as_dict(self) -> dict:
        """JSON form: ``{"compared", "agreed", "skipped", "agreement_rate", "disagreed_outputs",
        "differences": {"histogram": [{"upto": edge | None, "count"}], "nonfinite", "p50", "p90",
        "p99", "max"}, "latency_ms": {"serving": {"p50", "p95", "mean", "count"}, "candidate": {...}},
        "worst": [{"id", "max_abs_diff", "max_rel_diff", "output", "reason", "serving", "candidate"}]}``
        (worst first). Histogram buckets count per-request max absolute differences up to and
        including ``upto``; ``upto`` None is the bucket above the last edge."""
        values = sorted(self._abs)
        counts = [0] * (len(HISTOGRAM_EDGES) + 1)
        for value in values:
            counts[next((i for i, edge in enumerate(HISTOGRAM_EDGES) if value <= edge), len(HISTOGRAM_EDGES))] += 1
        histogram = [{"upto": edge, "count": counts[i]} for i, edge in enumerate(HISTOGRAM_EDGES)]
        histogram.append({"upto": None, "count": counts[-1]})
        worst = []
        for _, _, request_id, comparison, serving, candidate in sorted(self._worst, reverse=True):
            worst.append({"id": request_id, **comparison.as_dict(),
                          "serving": _preview(serving, self.preview_bytes),
                          "candidate": _preview(candidate, self.preview_bytes)})
        return {
            "compared": self.compared, "agreed": self.agreed, "skipped": self.skipped,
            "agreement_rate": self.agreement_rate, "disagreed_outputs": dict(sorted(self.disagreed_outputs.items())),
            "differences": {"histogram": histogram, "nonfinite": self.nonfinite, "p50": _quantile(values, 0.5),
                            "p90": _quantile(values, 0.9), "p99": _quantile(values, 0.99),
                            "max": values[-1] if values else None},
            "latency_ms": {side: _latency(times) for side, times in self._latency.items()},
            "worst": worst,
        }


def _latency(times: list[float]) -> dict:
    ordered = sorted(times)
    return {"count": len(ordered), "p50": _quantile(ordered, 0.5), "p95": _quantile(ordered, 0.95),
            "mean": float(np.mean(ordered)) if ordered else None}


def _preview(outputs: dict[str, Tensor] | None, limit: int) -> dict | None:
    """Both sides' outputs cut to about ``limit`` bytes in all (split evenly between outputs)."""
    if outputs is None:
        return None
    share = max(64, limit // max(1, len(outputs)))
    return {name: tensor.preview(share) for name, tensor in sorted(outputs.items())}
