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

Room is counted per device (``room_victims``): the budget applies to each GPU (by Triton's ``gpu_uuid``) and to CPU
memory separately, a footprint names the devices a model holds memory on, and a model holding nothing on the
devices a load needs is no victim for it, whatever its demand.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# The half-life of a model's demand score, seconds: a request counts half as much this long after it came.
DEMAND_HALF_LIFE_SECONDS = 300.0

# A footprint's device for CPU memory; GPUs are named by Triton's gpu_uuid ("GPU-5c3f7a9e-...").
CPU_DEVICE = "cpu"
# A footprint's device when the device is not known (a footprint declared as one figure, or kept by an agent that
# measured before footprints were per device): its bytes count against every device, which never undercounts one.
ANY_DEVICE = "*"


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


def device_totals(footprints: Iterable[Mapping[str, int]], devices: Iterable[str] = ()) -> dict[str, int]:
    """Bytes that ``footprints`` (each ``{device: bytes}``) hold together on each device: every device one of them
    names, and ``devices`` besides (0 where none holds any); bytes on ``ANY_DEVICE`` count on every device. With no
    device named at all, ``{ANY_DEVICE: their bytes}``."""
    footprints = list(footprints)
    named = {device for f in footprints for device in f if device != ANY_DEVICE} | set(devices) - {ANY_DEVICE}
    anywhere = sum(f.get(ANY_DEVICE, 0) for f in footprints)
    if not named:
        return {ANY_DEVICE: anywhere}
    return {device: anywhere + sum(f.get(device, 0) for f in footprints) for device in sorted(named)}


def overdrawn(held: Iterable[Mapping[str, int]], need: Mapping[str, int], budget: int) -> dict[str, int]:
    """The devices where the footprints ``held`` and ``need`` together pass ``budget`` (bytes, per device), with the
    bytes each holds then: the devices ``need`` names, or every device when it names ``ANY_DEVICE`` or none (an
    empty ``need`` asks whether what is held fits at all). Empty: it fits."""
    totals = device_totals([*held, need])
    checked = totals if not need or ANY_DEVICE in need else need
    return {device: totals[device] for device in checked if device in totals and totals[device] > budget}


def peak(footprint: Mapping[str, int]) -> int:
    """The most ``footprint`` holds on one device, bytes (its ``ANY_DEVICE`` bytes counted on each)."""
    return max(device_totals([footprint]).values())


def too_large(need: Mapping[str, int], budget: int) -> bool:
    """Whether ``need`` alone passes ``budget`` on a device (so no eviction can make room for it)."""
    return peak(need) > budget


def room_victims(need: Mapping[str, int], held: Mapping[str, Mapping[str, int]], order: Sequence[str],
                 budget: int) -> list[str] | None:
    """The models to evict so that ``need`` fits in ``budget`` on every device it names.

    Args:
        need: the footprint to make room for, ``{device: bytes}`` (``{}``: only bring what is held within the
            budget).
        held: what holds memory now, by name: each resident model's footprint and each load under way's
            reservation.
        order: the models that may go (idle, not pinned), first victim first (``DemandPolicy.victims``).
        budget: bytes each device may hold.

    Returns:
        The victims, in ``order``'s order: walking it, a model goes only while a device is over the budget and it
        holds bytes on one such device (a model on another GPU frees nothing the load needs). ``[]``: it fits
        already. None: even with every model of ``order`` gone, it would not fit.
    """
    held = dict(held)
    victims: list[str] = []
    over = overdrawn(held.values(), need, budget)
    for model in order:
        if not over:
            break
        footprint = held.get(model, {})
        if not any(footprint.get(device, 0) > 0 for device in (*over, ANY_DEVICE)):
            continue
        victims.append(model)
        del held[model]
        over = overdrawn(held.values(), need, budget)
    return None if over else victims
