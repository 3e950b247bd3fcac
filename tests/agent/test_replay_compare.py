"""Comparing two KServe v2 responses output by output, and the summary of a replay."""

import json
import math
import struct

import numpy as np
import pytest

from modelyard_agent.replay.captures import CapturedRequest, read_captured
from modelyard_agent.replay.compare import (
    ResponseError,
    Summary,
    Tolerances,
    compare_outputs,
    decode_response,
)


def response(*outputs) -> bytes:
    """A JSON response body of ``(name, datatype, shape, data)`` outputs."""
    return json.dumps({"model_name": "m", "model_version": "1", "outputs": [
        {"name": n, "datatype": d, "shape": s, "data": v} for n, d, s, v in outputs]}).encode()


def binary_response(*outputs) -> tuple[bytes, int]:
    """A binary-extension response of ``(name, datatype, shape, raw bytes)`` outputs: (body, header length)."""
    head = json.dumps({"model_name": "m", "outputs": [
        {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(raw)}}
        for n, d, s, raw in outputs]}).encode()
    return head + b"".join(raw for *_, raw in outputs), len(head)


def outs(*outputs) -> dict:
    return decode_response(response(*outputs))


def fp32(name, values, shape=None):
    values = list(values)
    return (name, "FP32", shape or [1, len(values)], values)


# -- reading responses -------------------------------------------------------------------------------


def test_a_json_response_is_read_into_arrays_of_its_shape_and_type():
    got = outs(("label", "INT64", [2, 1], [1, 2]), fp32("p", [0.5, 0.25, 0.125, 0.125], [2, 2]))
    assert got["label"].values.dtype == np.int64 and got["label"].values.shape == (2, 1)
    assert got["p"].values.tolist() == [[0.5, 0.25], [0.125, 0.125]]


def test_a_binary_response_is_read_like_its_json_twin():
    floats = np.array([[0.1, 0.9]], dtype="<f4")
    strings = b"".join(struct.pack("<I", len(s)) + s for s in (b"cat", b""))
    body, length = binary_response(("p", "FP32", [1, 2], floats.tobytes()), ("s", "BYTES", [2], strings),
                                   ("b", "BOOL", [2], bytes([1, 0])), ("h", "FP16", [1], np.float16(1.5).tobytes()))
    got = decode_response(body, length)
    assert got["p"].values.tolist() == floats.tolist()
    assert got["s"].values.tolist() == [b"cat", b""]
    assert got["b"].values.tolist() == [True, False] and got["h"].values.tolist() == [1.5]
    twin = outs(("p", "FP32", [1, 2], floats.tolist()), ("s", "BYTES", [2], ["cat", ""]),
                ("b", "BOOL", [2], [True, False]), ("h", "FP16", [1], [1.5]))
    assert compare_outputs(twin, got, Tolerances(atol=0, rtol=0)).agree


@pytest.mark.parametrize(("body", "length", "message"), [
    (b"not json", None, "not JSON"),
    (b'{"error": "unknown model"}', None, "no outputs"),
    (response(("p", "FP32", [1, 3], [1.0, 2.0])), None, "2 values for shape [1, 3]"),
    (response(("p", "WEIRD", [1], [1])), None, "unknown datatype"),
    (response(("p", "INT32", [1], ["x"])), None, "not INT32"),
    (binary_response(("p", "FP32", [1, 2], b"\0" * 4))[0], binary_response(("p", "FP32", [1, 2], b"\0" * 4))[1],
     "4 bytes for 2 FP32"),
    (b"{}", 10, "outside the body"),
])
def test_a_body_that_is_no_inference_response_is_an_error_naming_what_is_wrong(body, length, message):
    with pytest.raises(ResponseError, match=message.replace("[", r"\[").replace("]", r"\]")):
        decode_response(body, length)


def test_a_binary_size_past_the_body_is_an_error():
    body, length = binary_response(("p", "FP32", [1], b"\0" * 4))
    with pytest.raises(ResponseError, match="does not fit"):
        decode_response(body[:-2], length)


# -- comparing ---------------------------------------------------------------------------------------


def test_floats_within_atol_plus_rtol_times_the_serving_value_agree():
    serving = outs(fp32("p", [1.0, 100.0]))
    tol = Tolerances(atol=0.01, rtol=0.001)
    assert compare_outputs(serving, outs(fp32("p", [1.0099, 100.109])), tol).agree  # 0.01 + 0.1
    verdict = compare_outputs(serving, outs(fp32("p", [1.0, 100.12])), tol)
    assert not verdict.agree and verdict.output == "p" and "1 of 2 values" in verdict.reason
    assert verdict.max_abs_diff == pytest.approx(0.12, abs=1e-4)
    assert verdict.max_rel_diff == pytest.approx(0.0012, abs=1e-6)


def test_the_rule_is_numpys_isclose_which_is_not_symmetric():
    tol = Tolerances(atol=0.0, rtol=0.1)
    assert compare_outputs(outs(fp32("p", [10.0])), outs(fp32("p", [11.0])), tol).agree  # 1 <= 0.1 * 10
    assert not compare_outputs(outs(fp32("p", [11.0])), outs(fp32("p", [9.89])), tol).agree  # 1.11 > 1.1


@pytest.mark.parametrize("datatype", ["INT64", "INT32", "UINT8", "BOOL"])
def test_exact_types_must_be_equal_whatever_the_tolerance(datatype):
    one = [True] if datatype == "BOOL" else [1]
    other = [False] if datatype == "BOOL" else [2]
    tol = Tolerances(atol=10, rtol=10)
    assert compare_outputs(outs(("x", datatype, [1], one)), outs(("x", datatype, [1], one)), tol).agree
    verdict = compare_outputs(outs(("x", datatype, [1], one)), outs(("x", datatype, [1], other)), tol)
    assert not verdict.agree and f"{datatype} must be equal" in verdict.reason and verdict.max_abs_diff == 1


def test_strings_must_be_equal_and_have_no_numeric_difference():
    same = compare_outputs(outs(("s", "BYTES", [1], ["cat"])), outs(("s", "BYTES", [1], ["cat"])))
    differs = compare_outputs(outs(("s", "BYTES", [1], ["cat"])), outs(("s", "BYTES", [1], ["dog"])))
    assert same.agree and same.max_abs_diff is None
    assert not differs.agree and "BYTES must be equal" in differs.reason


def test_nan_agrees_only_with_nan_and_a_nan_against_a_number_has_no_finite_difference():
    nan = float("nan")
    assert compare_outputs(outs(fp32("p", [nan, 1.0])), outs(fp32("p", [nan, 1.0]))).agree
    verdict = compare_outputs(outs(fp32("p", [nan, 1.0])), outs(fp32("p", [0.0, 1.0])))
    assert not verdict.agree and verdict.nonfinite and verdict.max_abs_diff is None
    assert compare_outputs(outs(fp32("p", ["inf"])), outs(fp32("p", ["inf"]))).agree is True


def test_infinities_agree_with_the_same_infinity_only():
    inf = json.loads('{"v": Infinity}')["v"]
    assert compare_outputs(outs(fp32("p", [inf])), outs(fp32("p", [inf]))).agree
    assert not compare_outputs(outs(fp32("p", [inf])), outs(fp32("p", [-inf]))).agree


def test_a_missing_output_disagrees_naming_the_side_that_lacks_it():
    serving = outs(fp32("p", [1.0]), ("label", "INT64", [1], [0]))
    verdict = compare_outputs(serving, outs(fp32("p", [1.0])))
    assert not verdict.agree and verdict.output == "label" and "missing from the candidate" in verdict.reason
    extra = compare_outputs(outs(fp32("p", [1.0])), serving)
    assert not extra.agree and "missing from the serving version" in extra.reason


def test_a_different_shape_disagrees_without_comparing_values():
    verdict = compare_outputs(outs(fp32("p", [1.0, 2.0], [1, 2])), outs(fp32("p", [1.0, 2.0], [2, 1])))
    assert not verdict.agree and "shape [2, 1] on the candidate, [1, 2]" in verdict.reason
    assert verdict.max_abs_diff is None


def test_a_datatype_of_another_kind_disagrees_but_float_widths_compare_by_value():
    assert not compare_outputs(outs(("x", "INT64", [1], [1])), outs(("x", "INT32", [1], [1]))).agree
    assert not compare_outputs(outs(("x", "INT64", [1], [1])), outs(("x", "FP32", [1], [1.0]))).agree
    assert compare_outputs(outs(("x", "FP64", [1], [0.5])), outs(("x", "FP16", [1], [0.5]))).agree


def test_score_vectors_named_for_argmax_agree_on_the_class_and_still_report_their_difference():
    tol = Tolerances(atol=0, rtol=0, argmax_outputs=("p",))
    serving = outs(fp32("p", [0.1, 0.7, 0.2, 0.6, 0.3, 0.1], [2, 3]))
    same_class = compare_outputs(serving, outs(fp32("p", [0.2, 0.5, 0.3, 0.5, 0.4, 0.1], [2, 3])), tol)
    assert same_class.agree and same_class.max_abs_diff == pytest.approx(0.2)
    flipped = compare_outputs(serving, outs(fp32("p", [0.1, 0.7, 0.2, 0.3, 0.6, 0.1], [2, 3])), tol)
    assert not flipped.agree and "argmax" in flipped.reason
    assert not compare_outputs(serving, outs(fp32("p", [0.2, 0.5, 0.3, 0.5, 0.4, 0.1], [2, 3])),
                               Tolerances(atol=0, rtol=0)).agree


def test_the_first_disagreeing_output_by_name_is_named_and_differences_span_every_output():
    serving = outs(fp32("a", [1.0]), fp32("b", [1.0]), ("c", "INT64", [1], [1]))
    verdict = compare_outputs(serving, outs(fp32("a", [1.0]), fp32("b", [3.0]), ("c", "INT64", [1], [5])))
    assert verdict.output == "b" and verdict.max_abs_diff == 4.0


def test_empty_tensors_agree():
    assert compare_outputs(outs(fp32("p", [], [0, 3])), outs(fp32("p", [], [0, 3]))).agree


def test_tolerances_refuse_negative_or_non_numbers_and_read_back_their_json():
    assert Tolerances.from_dict(Tolerances(0.1, 0.2, ("p",)).as_dict()) == Tolerances(0.1, 0.2, ("p",))
    for bad in ({"atol": -1}, {"rtol": "x"}, {"atol": True}, {"argmax_outputs": "p"}, {"rtol": float("nan")}):
        with pytest.raises(ValueError):
            Tolerances.from_dict(bad)


# -- the summary -------------------------------------------------------------------------------------


def test_the_summary_gives_the_agreement_rate_the_difference_distribution_and_the_worst_requests():
    summary = Summary(worst_count=2, preview_bytes=200)
    serving = outs(fp32("p", [1.0] * 3))
    for index, delta in enumerate([0.0, 1e-6, 0.5, 2.0, 0.05]):
        candidate = outs(fp32("p", [1.0 + delta] * 3))
        summary.add(f"r{index}", compare_outputs(serving, candidate, Tolerances(atol=0.01, rtol=0)), serving,
                    candidate, serving_ms=1.0 + index, candidate_ms=2.0 + index)
    summary.skip()
    data = summary.as_dict()
    assert data["compared"] == 5 and data["agreed"] == 2 and data["skipped"] == 1
    assert data["agreement_rate"] == pytest.approx(0.4)
    assert [w["id"] for w in data["worst"]] == ["r3", "r2"]
    assert data["worst"][0]["serving"]["p"]["data"] == [1.0, 1.0, 1.0]
    assert data["differences"]["max"] == pytest.approx(2.0) and data["differences"]["p50"] == pytest.approx(0.05,
                                                                                                            rel=1e-3)
    buckets = {b["upto"]: b["count"] for b in data["differences"]["histogram"]}
    assert buckets[0.0] == 1 and buckets[1e-6] == 1 and buckets[0.1] == 1 and buckets[1.0] == 1 and buckets[None] == 1
    assert data["latency_ms"]["serving"]["p50"] == 3.0 and data["latency_ms"]["candidate"]["count"] == 5
    assert data["disagreed_outputs"] == {"p": 3}
    json.dumps(data, allow_nan=False)


def test_worst_outputs_are_cut_to_the_byte_bound():
    summary = Summary(worst_count=1, preview_bytes=100)
    serving, candidate = outs(fp32("p", [1.0] * 1000)), outs(fp32("p", [2.0] * 1000))
    summary.add("r", compare_outputs(serving, candidate), serving, candidate)
    kept = summary.as_dict()["worst"][0]["candidate"]["p"]
    assert kept["truncated"] and 0 < len(json.dumps(kept["data"])) <= 100 and kept["shape"] == [1, 1000]


def test_a_failed_candidate_is_among_the_worst_and_no_finite_difference_is_invented():
    from modelyard_agent.replay.compare import RequestComparison

    summary = Summary(worst_count=3)
    serving = outs(fp32("p", [1.0]))
    summary.add("ok", compare_outputs(serving, outs(fp32("p", [1.5]))), serving, outs(fp32("p", [1.5])))
    summary.add("err", RequestComparison(False, reason="the candidate answered 500"), serving, None)
    data = summary.as_dict()
    assert [w["id"] for w in data["worst"]] == ["err", "ok"] and data["worst"][0]["candidate"] is None
    assert data["differences"]["nonfinite"] == 0 and data["differences"]["max"] == 0.5
    assert math.isclose(data["agreement_rate"], 0.0)


def test_an_empty_summary_has_no_rate_and_no_quantiles():
    data = Summary().as_dict()
    assert data["agreement_rate"] is None and data["differences"]["p50"] is None
    assert data["latency_ms"]["serving"]["p95"] is None


# -- capture files -----------------------------------------------------------------------------------


def captured(index: int, model: str = "iris", time: float | None = None) -> CapturedRequest:
    return CapturedRequest(id=f"{index:032x}", time=time if time is not None else 1000.0 + index, model=model,
                           version=1, content_type="application/json", header_length=None,
                           body=json.dumps({"inputs": [index]}).encode())


def test_captured_requests_are_read_newest_first_skipping_a_cut_short_last_line(tmp_path):
    (tmp_path / "a.ndjson").write_text("\n".join(captured(i).as_line() for i in range(3)) + "\n")
    partial = captured(9).as_line()
    (tmp_path / "b.ndjson").write_text(captured(5).as_line() + "\n" + captured(6, model="other").as_line()
                                       + "\n" + partial[: len(partial) // 2])
    (tmp_path / "notes.txt").write_text("not a capture")
    read = read_captured(tmp_path, model="iris", limit=10)
    assert [r.id[-1] for r in read.requests] == ["5", "2", "1", "0"]
    assert read.unreadable == 0 and read.files == 2
    assert read.requests[0].body == b'{"inputs": [5]}'
    assert read.requests[0].headers() == {"Content-Type": "application/json"}


def test_a_broken_line_inside_a_file_is_counted_and_the_limit_keeps_the_newest(tmp_path):
    (tmp_path / "a.ndjson").write_text(captured(1).as_line() + "\n{broken\n" + captured(2).as_line() + "\n")
    read = read_captured(tmp_path, model="iris", limit=1)
    assert [r.id[-1] for r in read.requests] == ["2"] and read.unreadable == 1
    assert read_captured(tmp_path / "missing", model="iris", limit=5).requests == []


def test_a_binary_request_sends_its_header_length_again():
    request = CapturedRequest(id="0" * 32, time=1.0, model="m", version=2, content_type="application/octet-stream",
                              header_length=42, body=b"\0" * 50)
    assert request.headers() == {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": "42"}
