"""The gate logic on known numbers, without Prometheus."""

import pytest

from promotions.gates import Limits, judge, summarise

GOOD = {"requests": 1200, "latency_p95_ms": 10.5, "error_rate": 0.0}
BASELINE = {"requests": 1200, "latency_p95_ms": 10.0, "error_rate": 0.001}
LIMITS = Limits(min_requests=100, max_p95_ms=50, max_error_rate=0.01, max_regression=0.1)


def failed(checks):
    return sorted(c.gate for c in checks if not c.passed)


def test_a_candidate_within_every_limit_passes():
    checks = judge(LIMITS, GOOD, BASELINE, has_target=True)
    assert failed(checks) == []
    assert [c.gate for c in checks] == ["min_requests", "max_p95_ms", "max_error_rate", "max_regression_p95",
                                        "max_regression_error_rate"]
    assert summarise(checks) == "every gate passed"


@pytest.mark.parametrize("seen,gate", [
    ({**GOOD, "requests": 99}, "min_requests"),
    ({**GOOD, "latency_p95_ms": 50.1}, "max_p95_ms"),
    ({**GOOD, "error_rate": 0.0101}, "max_error_rate"),
])
def test_each_absolute_gate_holds_a_candidate_past_its_limit(seen, gate):
    checks = judge(Limits(100, 50, 0.01), seen, None, has_target=False)
    assert failed(checks) == [gate]
    assert summarise(checks).startswith("held: ")


def test_a_candidate_more_than_the_allowed_fraction_slower_than_the_target_is_held():
    checks = judge(LIMITS, {**GOOD, "latency_p95_ms": 11.2}, BASELINE, has_target=True)
    assert failed(checks) == ["max_regression_p95"]
    regression = next(c for c in checks if c.gate == "max_regression_p95")
    assert regression.value == pytest.approx(0.12)
    assert "+12.0 %" in regression.message


def test_any_error_rate_is_a_regression_against_a_target_without_errors():
    checks = judge(Limits(max_regression=0.5), {**GOOD, "error_rate": 0.0001}, {**BASELINE, "error_rate": 0.0},
                   has_target=True)
    assert failed(checks) == ["max_regression_error_rate"]


def test_a_candidate_without_any_data_fails_every_gate_that_is_on():
    checks = judge(LIMITS, None, BASELINE, has_target=True)
    assert failed(checks) == sorted(["min_requests", "max_p95_ms", "max_error_rate", "max_regression_p95",
                                     "max_regression_error_rate"])


def test_the_regression_gate_needs_traffic_on_the_target_version():
    checks = judge(Limits(max_regression=0.1), GOOD, {"requests": 0, "latency_p95_ms": None, "error_rate": None},
                   has_target=True)
    assert failed(checks) == ["max_regression"]


def test_a_first_promotion_has_no_target_to_regress_against():
    checks = judge(Limits(max_regression=0.1), GOOD, None, has_target=False)
    assert failed(checks) == []


def test_gates_left_empty_are_not_checked():
    assert judge(Limits(), None, None, has_target=True) == []
    assert summarise([]) == "no gates are set"


def test_the_profile_gate_needs_a_comparison_and_passes_a_first_promotion():
    limits = Limits(max_profile_regression=0.1)
    held = judge(limits, {}, {}, has_target=True, profiles={"missing": "v1 (the target) has no performance card"})
    assert [(c.gate, c.passed) for c in held] == [("max_profile_regression", False)]
    assert "no performance card" in held[0].message
    first = judge(limits, {}, None, has_target=False)
    assert [(c.gate, c.passed) for c in first] == [("max_profile_regression", True)]
    compared = {"candidate_throughput": 900.0, "target_throughput": 1000.0, "host": "staging",
                "config_label": "1 instance", "concurrency": 2}
    assert judge(limits, {}, {}, has_target=True, profiles=compared)[0].passed  # exactly 10 % lower
    assert not judge(Limits(max_profile_regression=0.05), {}, {}, has_target=True, profiles=compared)[0].passed
