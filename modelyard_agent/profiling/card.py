"""Reading a performance card: the config to serve with for a latency target, and the Pareto front.

A card is the rows one profile measured (``contract.ProfileRow``): one per (config, concurrency)
with throughput in inferences per second and latencies in milliseconds. Rows with an ``error``
(a level perf_analyzer could not measure stably, a config that did not load) are shown but never
recommended.
"""

from __future__ import annotations

from collections.abc import Iterable


def measured(rows: Iterable[dict]) -> list[dict]:
    """The rows that hold a measurement (no ``error``, a throughput and a p99)."""
    return [row for row in rows if not row.get("error") and row.get("throughput") is not None
            and row.get("p99_ms") is not None]


def recommend(rows: Iterable[dict], slo_p99_ms: float | None) -> dict | None:
    """The config with the highest throughput whose p99 stays within the SLO, and where it holds.

    Args:
        rows: a profile's rows.
        slo_p99_ms: the latency target, milliseconds of client p99; None: no target (the highest
            throughput measured).

    Returns:
        ``{"config": {...}, "concurrency": int, "throughput": float, "p99_ms": float,
        "memory_bytes": int | None}`` of the best row (ties: the lower p99, then fewer instances),
        or None when no row meets the SLO.
    """
    fitting = [row for row in measured(rows) if slo_p99_ms is None or row["p99_ms"] <= slo_p99_ms]
    if not fitting:
        return None
    best = max(fitting, key=lambda row: (row["throughput"], -row["p99_ms"],
                                         -int((row.get("config") or {}).get("instance_count", 1))))
    return {"config": best["config"], "concurrency": best["concurrency"], "throughput": best["throughput"],
            "p99_ms": best["p99_ms"], "memory_bytes": best.get("memory_bytes")}


def pareto_front(rows: Iterable[dict]) -> list[dict]:
    """The rows no other row beats on both throughput (higher) and p99 (lower), by ascending p99.

    A row is dominated when another has at least its throughput and at most its p99, and is
    strictly better in one. Cost: O(n log n).
    """
    front: list[dict] = []
    best_throughput = float("-inf")
    for row in sorted(measured(rows), key=lambda r: (r["p99_ms"], -r["throughput"])):
        if row["throughput"] > best_throughput:
            front.append(row)
            best_throughput = row["throughput"]
    return front


def throughput_at(rows: Iterable[dict], config_key: str, concurrency: int) -> float | None:
    """The throughput (inferences/s) a card measured for one config at one concurrency, or None."""
    for row in measured(rows):
        if (row.get("config") or {}).get("key") == config_key and row["concurrency"] == concurrency:
            return float(row["throughput"])
    return None
