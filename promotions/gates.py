"""Promotion gates: pure functions that judge a candidate version's metrics against a policy's limits.

Inputs are what ``monitoring.services.version_gate_metrics`` returns for one version,
``{"requests": count, "latency_p95_ms": ms, "error_rate": 0..1}`` (values may be None), or None
when Prometheus holds nothing for the version. A limit of None switches its gate off. Missing data
never passes a gate that is on: a promotion needs evidence.
"""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Limits:
    """A policy's gates: ``min_requests`` (count), ``max_p95_ms`` (ms), ``max_error_rate`` (0..1),
    ``max_regression`` (relative, 0.1 = the candidate may be 10 % worse than the target version),
    ``max_profile_regression`` (relative, 0.1 = the candidate's card may show 10 % less throughput
    than the target version's), ``min_agreement`` (0..1, the share of replayed requests whose answers
    agree) and ``max_latency_regression`` (relative, 0.2 = the candidate's replayed p95 may be 20 %
    above the target version's)."""

    min_requests: int | None = None
    max_p95_ms: float | None = None
    max_error_rate: float | None = None
    max_regression: float | None = None
    max_profile_regression: float | None = None
    min_agreement: float | None = None
    max_latency_regression: float | None = None


@dataclass(frozen=True)
class Check:
    """One gate's verdict: its name, whether it passed, the value seen, the limit, and a sentence."""

    gate: str
    passed: bool
    value: float | None
    limit: float | None
    message: str

    def as_dict(self) -> dict:
        """The check as JSON-serialisable data."""
        return asdict(self)


def _ms(value: float) -> str:
    return f"{value:.1f} ms"


def _fine_ms(value: float) -> str:
    return f"{value:.2f} ms"


def _pct(value: float) -> str:
    return f"{value * 100:.2f} %"


def _requests(limits: Limits, seen: dict) -> Check | None:
    if limits.min_requests is None:
        return None
    count = seen.get("requests") or 0
    passed = count >= limits.min_requests
    words = "" if passed else "only "
    return Check("min_requests", passed, count, limits.min_requests,
                 f"{words}{count:.0f} requests in the window (at least {limits.min_requests} needed)")


def _ceiling(gate: str, what: str, value, limit, show) -> Check | None:
    if limit is None:
        return None
    if value is None:
        return Check(gate, False, None, limit, f"no {what} for the candidate in the window")
    passed = value <= limit
    return Check(gate, passed, value, limit, f"{what} {show(value)} ({'within' if passed else 'above'} "
                                             f"the maximum of {show(limit)})")


def _regression(gate: str, what: str, value, baseline, allowed: float, show) -> Check:
    if value is None or baseline is None:
        return Check(gate, False, None, allowed, f"no {what} to compare with the target version")
    ceiling = baseline * (1 + allowed)
    relative = (value / baseline - 1) if baseline > 0 else (0.0 if value == 0 else None)
    passed = value <= ceiling
    change = f"{relative * 100:+.1f} %" if relative is not None else "worse than none"
    return Check(gate, passed, relative, allowed,
                 f"{what} {show(value)} against the target's {show(baseline)} ({change}; "
                 f"at most {allowed * 100:+.1f} % allowed)")


def _profile_regression(limits: Limits, profiles: dict | None, has_target: bool) -> Check | None:
    allowed = limits.max_profile_regression
    if allowed is None:
        return None
    if not has_target:
        return Check("max_profile_regression", True, None, allowed, "no target version yet: nothing to compare with")
    profiles = profiles or {}
    if profiles.get("missing"):
        return Check("max_profile_regression", False, None, allowed, profiles["missing"])
    value, baseline = profiles["candidate_throughput"], profiles["target_throughput"]
    relative = value / baseline - 1
    passed = relative >= -allowed
    where = f"{profiles['config_label']} at concurrency {profiles['concurrency']} on {profiles['host']}"
    return Check("max_profile_regression", passed, relative, allowed,
                 f"throughput {value:,.0f}/s against the target's {baseline:,.0f}/s ({relative * 100:+.1f} %; "
                 f"at most {-allowed * 100:.1f} % allowed), {where}")


def _replay_checks(limits: Limits, replay: dict | None, has_target: bool) -> list[Check]:
    checks = []
    for gate, allowed in (("min_agreement", limits.min_agreement),
                          ("max_latency_regression", limits.max_latency_regression)):
        if allowed is None:
            continue
        if not has_target:
            checks.append(Check(gate, True, None, allowed, "no target version yet: nothing to compare with"))
            continue
        replay = replay or {"missing": "no replay of the candidate against the target version"}
        if replay.get("missing"):
            checks.append(Check(gate, False, None, allowed, replay["missing"]))
            continue
        where = f"replay {replay['id']}, {replay['compared']} captured requests"
        if gate == "min_agreement":
            rate = replay.get("agreement_rate")
            passed = rate is not None and rate >= allowed
            shown = "none" if rate is None else _pct(rate)
            checks.append(Check(gate, passed, rate, allowed, f"agreement with the target version {shown} "
                                f"({'at least' if passed else 'below'} the minimum of {_pct(allowed)}), {where}"))
        else:
            value, base = replay.get("candidate_p95_ms"), replay.get("serving_p95_ms")
            if value is None or not base:
                checks.append(Check(gate, False, None, allowed, f"no replayed latency to compare ({where})"))
                continue
            relative = value / base - 1
            passed = relative <= allowed
            checks.append(Check(gate, passed, relative, allowed,
                                f"replayed p95 {_fine_ms(value)} against the target's {_fine_ms(base)} "
                                f"({relative * 100:+.1f} %; at most {allowed * 100:+.1f} % allowed), {where}"))
    return checks


def judge(limits: Limits, candidate: dict | None, target: dict | None, *, has_target: bool,
          profiles: dict | None = None, replay: dict | None = None) -> list[Check]:
    """Run every gate that is on.

    Args:
        limits: the policy's gates.
        candidate: the candidate version's metrics, or None when Prometheus has none.
        target: the metrics of the version the target alias names now, or None.
        has_target: whether the target alias names a version at all; without one (a first
            promotion) the regression gates pass with nothing to compare.
        profiles: for ``max_profile_regression``, ``deployments.profiles.profile_comparison`` of the
            candidate and target versions (throughputs in inferences/s, or ``missing``: why not).
        replay: for ``min_agreement`` and ``max_latency_regression``, the replay's evidence
            (``{"id", "compared", "agreement_rate", "serving_p95_ms", "candidate_p95_ms"}``, or
            ``{"missing": sentence}``: why there is none yet).

    Returns:
        One Check per gate that is on; the candidate passes when every check passed.
    """
    seen = candidate or {}
    checks = [
        _requests(limits, seen),
        _ceiling("max_p95_ms", "p95 latency", seen.get("latency_p95_ms"), limits.max_p95_ms, _ms),
        _ceiling("max_error_rate", "error rate", seen.get("error_rate"), limits.max_error_rate, _pct),
    ]
    if limits.max_regression is not None:
        if not has_target:
            checks.append(Check("max_regression", True, None, limits.max_regression,
                                "no target version yet: nothing to compare with"))
        elif not (target or {}).get("requests"):
            checks.append(Check("max_regression", False, None, limits.max_regression,
                                "the target version served no requests in the window: nothing to compare with"))
        else:
            checks.append(_regression("max_regression_p95", "p95 latency", seen.get("latency_p95_ms"),
                                      target.get("latency_p95_ms"), limits.max_regression, _ms))
            checks.append(_regression("max_regression_error_rate", "error rate", seen.get("error_rate"),
                                      target.get("error_rate"), limits.max_regression, _pct))
    checks.append(_profile_regression(limits, profiles, has_target))
    checks.extend(_replay_checks(limits, replay, has_target))
    return [c for c in checks if c is not None]


def summarise(checks: list[Check]) -> str:
    """One line for people: the failed gates' messages, or that every gate passed."""
    failed = [c.message for c in checks if not c.passed]
    if failed:
        return "held: " + "; ".join(failed)
    return "every gate passed" if checks else "no gates are set"
