"""Which on-demand model to evict first: the policy alone, apart from the loading mechanism (``residency``), with no
I/O and no clock of its own, so the loader and ``bench/on_demand.py``'s offline simulation run the same code on
the same requests.

The order: least demand first, a model's demand being its requests decayed exponentially with a half-life of
``DEMAND_HALF_LIFE_SECONDS`` (each request counts ``0.5 ** (age / half_life)``), then least recently used.

Why not plain LRU: under a skewed (Zipf) load, a burst of rare models pushes the popular ones out of an LRU cache,
and each comes back at the cost of a load; weighing how often a model is asked keeps the popular ones
(``bench/results/on_demand.md`` sets its hit rate beside LRU's and Belady's optimum on one trace). The decayed
count is the "frequency with aging" of LFU-DA and of the exponentially decayed LRFU family (Lee et al., "LRFU: A
Spectrum of Policies that Subsumes the Least Recently Used and Least Frequently Used Policies", IEEE Trans.
Computers 50(12), 2001), with recency as the tie-break.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# The half-life of a model's demand score, seconds: a request counts half as much this long after it came.
DEMAND_HALF_LIFE_SECONDS = 300.0


@dataclass
class DemandPolicy:
    """Decayed demand per model, fed with cumulative request counts, and the eviction order it gives.

    Attributes:
        half_life: seconds after which a request counts half.
        demand: per model, ``(score, requests counted so far, when the score was last decayed)`` (seconds on the
            caller's clock).
    """

    half_life: float = DEMAND_HALF_LIFE_SECONDS
    demand: dict[str, tuple[float, int, float]] = field(default_factory=dict)

    def observe(self, requests: Mapping[str, int], now: float) -> None:
        """Fold what each model was asked since the last look into its decayed score.

        Args:
            requests: per model, the requests counted since its counter started (cumulative); a count below the
                last one seen means the counter restarted (a restarted gateway counts from 0 again), and counts
                whole.
            now: the time of the look, in seconds on any monotonic clock the caller keeps to.
        """
        for model, total in requests.items():
            score, counted, then = self.demand.get(model, (0.0, 0, now))
            rise = total - counted if total >= counted else total
            self.demand[model] = (score * 0.5 ** ((now - then) / self.half_life) + rise, total, now)

    def score(self, model: str, now: float) -> float:
        """``model``'s demand at ``now`` (seconds, the clock of ``observe``): its score decayed since it was last
        observed; 0 for a model never observed."""
        score, _, then = self.demand.get(model, (0.0, 0, now))
        return score * 0.5 ** ((now - then) / self.half_life)

    def victims(self, candidates: Iterable[str], last_used: Mapping[str, float | None], now: float) -> list[str]:
        """``candidates`` (the models that may go: resident, not pinned) in the order they go at ``now``: least
        demand first, then least recently used (``last_used``: per model, the time of its last request on any
        clock, None or absent for never)."""
        return sorted(candidates, key=lambda model: (self.score(model, now), last_used.get(model) or 0))


def simulate_hits(policy: DemandPolicy, trace: list[str], capacity: int, times: list[float]) -> int:
    """Hits of ``policy`` evicting among equal-sized models with room for ``capacity`` on ``trace`` (the models
    asked, in order, at ``times``, seconds): as the loader does, a miss loads the model, first evicting the
    policy's first victim among the others when the room is full; the policy observes each request as it comes."""
    resident: set[str] = set()
    counts: dict[str, int] = {}
    last_used: dict[str, float] = {}
    hits = 0
    for model, now in zip(trace, times, strict=True):
        counts[model] = counts.get(model, 0) + 1
        policy.observe({model: counts[model]}, now)
        if model in resident:
            hits += 1
        else:
            if len(resident) >= capacity:
                resident.discard(policy.victims(resident, last_used, now)[0])
            resident.add(model)
        last_used[model] = now
    return hits
