"""What a profile measures: the serving configs of a sweep and the concurrency levels of each.

A sweep request is a JSON object (the API's ``sweep``) or the name of a preset. Every field is
optional; what is missing comes from the preset named by ``preset`` (default ``quick``):

| field | meaning | bounds |
| --- | --- | --- |
| ``instance_counts`` | instances per instance group | 1..64, at most 6 values |
| ``dynamic_batching`` | ``[false, true]``: without and with Triton's dynamic batcher | booleans |
| ``max_batch_sizes`` | ``max_batch_size`` values; default the version's own | 1..the version's limit |
| ``preferred_batch_sizes`` | the batcher's preferred sizes | each ≤ the config's max batch size |
| ``max_queue_delay_us`` | the batcher's ``max_queue_delay_microseconds`` | 0..1,000,000 µs |
| ``concurrency`` | perf_analyzer ``--concurrency-range`` values (wrk connections) | 1..1024, at most 12 values |
| ``measurement_interval_ms`` | one measurement window, milliseconds | 200..30,000 |
| ``stability_percentage`` | perf_analyzer's ``-s``: 3 windows within this many percent | 1..100 |
| ``max_trials`` | perf_analyzer's ``-r``: windows tried before a level counts as unstable | 3..50 |
| ``time_budget_s`` | seconds the whole profile may take on the host | 30..3,600 |

A version that does not batch (``max_batch_size: 0``) is swept over instance counts only. A
BentoML version is measured as it serves, over concurrency only: its config fields are refused.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field

from modelyard_agent.contract import Runtime

MAX_INSTANCE_COUNT = 64
MAX_CONCURRENCY = 1024
MAX_CONFIGS = 24
MIN_BUDGET_SECONDS, MAX_BUDGET_SECONDS = 30, 3600
# Seconds a load and an unload of one profiling copy are assumed to take, for the estimate.
LOAD_ALLOWANCE_SECONDS = 5.0
# perf_analyzer's stability rule takes at least three windows per concurrency level.
WINDOWS_PER_LEVEL = 3

PRESETS: dict[str, dict] = {
    # A first look in about a minute on a CPU host.
    "quick": {"instance_counts": [1, 2], "dynamic_batching": [False, True], "max_queue_delay_us": 100,
              "concurrency": [1, 4], "measurement_interval_ms": 1000, "stability_percentage": 10,
              "max_trials": 10, "time_budget_s": 300},
    # What a staging host should measure before a version goes to production.
    "standard": {"instance_counts": [1, 2, 4], "dynamic_batching": [False, True], "max_queue_delay_us": 100,
                 "concurrency": [1, 2, 4, 8, 16], "measurement_interval_ms": 2000, "stability_percentage": 10,
                 "max_trials": 10, "time_budget_s": 1800},
}
DEFAULT_PRESET = "quick"
CONFIG_FIELDS = ("instance_counts", "dynamic_batching", "max_batch_sizes", "preferred_batch_sizes",
                 "max_queue_delay_us")
ALL_FIELDS = ("preset", *CONFIG_FIELDS, "concurrency", "measurement_interval_ms", "stability_percentage",
              "max_trials", "time_budget_s")


class SweepError(ValueError):
    """A sweep request that cannot be run; the message names the field."""


@dataclass(frozen=True)
class ProfileConfig:
    """One serving config of a sweep.

    Attributes:
        instance_count: instances per instance group (Triton ``instance_group[].count``).
        dynamic_batching: whether Triton's dynamic batcher is on.
        max_batch_size: the config's ``max_batch_size`` (0: the version does not batch).
        preferred_batch_sizes: the batcher's preferred sizes (with batching only).
        max_queue_delay_us: the batcher's ``max_queue_delay_microseconds`` (with batching only).
        as_served: a BentoML version measured as it serves (no config of its own).
    """

    instance_count: int = 1
    dynamic_batching: bool = False
    max_batch_size: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    as_served: bool = False

    @property
    def key(self) -> str:
        """A short stable name, e.g. ``i2-db8-q100`` or ``i1-nobatch`` (``served`` for BentoML)."""
        if self.as_served:
            return "served"
        if not self.dynamic_batching:
            return f"i{self.instance_count}-nobatch"
        return f"i{self.instance_count}-db{self.max_batch_size}-q{self.max_queue_delay_us}"

    @property
    def label(self) -> str:
        """A reader's name, e.g. ``2 instances, dynamic batching ≤ 8 (100 µs)``."""
        if self.as_served:
            return "as served"
        instances = f"{self.instance_count} instance{'s' if self.instance_count != 1 else ''}"
        if not self.dynamic_batching:
            return f"{instances}, no dynamic batching"
        return f"{instances}, dynamic batching ≤ {self.max_batch_size} ({self.max_queue_delay_us} µs)"

    def as_dict(self) -> dict:
        """JSON form (lists for tuples), with ``key`` and ``label``."""
        return {**asdict(self), "preferred_batch_sizes": list(self.preferred_batch_sizes),
                "key": self.key, "label": self.label}

    @classmethod
    def from_dict(cls, data: dict) -> ProfileConfig:
        """The inverse of ``as_dict`` (``key`` and ``label`` are ignored)."""
        return cls(instance_count=int(data.get("instance_count", 1)),
                   dynamic_batching=bool(data.get("dynamic_batching", False)),
                   max_batch_size=int(data.get("max_batch_size", 0)),
                   preferred_batch_sizes=tuple(int(v) for v in data.get("preferred_batch_sizes") or ()),
                   max_queue_delay_us=int(data.get("max_queue_delay_us", 0)),
                   as_served=bool(data.get("as_served", False)))

    def config_overrides(self, instance_groups: list[dict]) -> dict:
        """The deployment ``config_overrides`` that serve with this config
        (``formats.triton_config.check_config_overrides``; ``dynamic_batching: None`` turns the
        batcher off).

        Args:
            instance_groups: the version's own ``instance_group`` entries (protobuf JSON); each keeps
                its kind and devices and gets this config's count. Empty: one group of Triton's
                default kind.

        Returns:
            ``{"instance_group": [...], "dynamic_batching": {...} | None, "max_batch_size"?: int}``;
            ``{}`` for a config measured as served.
        """
        if self.as_served:
            return {}
        groups = [{**group, "count": self.instance_count} for group in instance_groups] or \
            [{"count": self.instance_count}]
        overrides: dict = {"instance_group": groups}
        if self.max_batch_size:
            overrides["max_batch_size"] = self.max_batch_size
        if self.dynamic_batching:
            batching: dict = {"max_queue_delay_microseconds": self.max_queue_delay_us}
            if self.preferred_batch_sizes:
                batching["preferred_batch_size"] = list(self.preferred_batch_sizes)
            overrides["dynamic_batching"] = batching
        else:
            overrides["dynamic_batching"] = None
        return overrides


@dataclass(frozen=True)
class Sweep:
    """A checked sweep: the configs to load, the levels to drive each at, and how to measure.

    Attributes:
        configs: the serving configs, in the order they are measured.
        concurrency: concurrent requests in flight (perf_analyzer ``--concurrency-range c:c``; wrk
            connections), ascending.
        measurement_interval_ms: one measurement window, milliseconds.
        stability_percentage: perf_analyzer's stability threshold, percent.
        max_trials: windows perf_analyzer tries per level before it gives up on stability.
        time_budget_s: seconds the whole profile may take on the host.
    """

    configs: tuple[ProfileConfig, ...]
    concurrency: tuple[int, ...]
    measurement_interval_ms: int
    stability_percentage: int
    max_trials: int
    time_budget_s: int
    request: dict = field(default_factory=dict, compare=False)

    @property
    def runs(self) -> int:
        """Load-generator runs in the sweep: configs × concurrency levels."""
        return len(self.configs) * len(self.concurrency)

    @property
    def least_seconds(self) -> float:
        """The shortest time the sweep can take, seconds: three windows per run, plus a load and an
        unload allowance per config."""
        return (self.runs * WINDOWS_PER_LEVEL * self.measurement_interval_ms / 1000
                + len(self.configs) * LOAD_ALLOWANCE_SECONDS)

    def as_dict(self) -> dict:
        """JSON form, as stored with the profile and sent to the agent."""
        return {"configs": [c.as_dict() for c in self.configs], "concurrency": list(self.concurrency),
                "measurement_interval_ms": self.measurement_interval_ms,
                "stability_percentage": self.stability_percentage, "max_trials": self.max_trials,
                "time_budget_s": self.time_budget_s, "request": self.request}

    @classmethod
    def from_dict(cls, data: dict) -> Sweep:
        """The inverse of ``as_dict`` (an already checked sweep, e.g. from a payload)."""
        return cls(configs=tuple(ProfileConfig.from_dict(c) for c in data["configs"]),
                   concurrency=tuple(int(c) for c in data["concurrency"]),
                   measurement_interval_ms=int(data["measurement_interval_ms"]),
                   stability_percentage=int(data["stability_percentage"]), max_trials=int(data["max_trials"]),
                   time_budget_s=int(data["time_budget_s"]), request=dict(data.get("request") or {}))


def parse_sweep(raw: dict | str | None, *, max_batch_size: int, runtime: str = Runtime.TRITON) -> Sweep:
    """Check a sweep request and expand it into configs.

    Args:
        raw: a JSON object (see the module's table), a preset's name, or None (the default preset).
        max_batch_size: the version's own ``max_batch_size`` (0: it does not batch); the limit of
            ``max_batch_sizes``.
        runtime: the host's runtime; a BentoML sweep takes no config fields.

    Returns:
        The checked ``Sweep``; ``request`` holds what was asked, preset fields filled in.

    Raises:
        SweepError: an unknown preset or field, a value out of bounds, more than ``MAX_CONFIGS``
            configs, or a time budget shorter than the sweep's ``least_seconds``.
    """
    if raw is None or isinstance(raw, str):
        raw = {"preset": raw or DEFAULT_PRESET}
    if not isinstance(raw, dict):
        raise SweepError("sweep must be a JSON object or the name of a preset "
                         f"({', '.join(sorted(PRESETS))})")
    unknown = sorted(set(raw) - set(ALL_FIELDS))
    if unknown:
        raise SweepError(f"unknown sweep field(s) {', '.join(unknown)}; known: {', '.join(ALL_FIELDS)}")
    preset = raw.get("preset") or DEFAULT_PRESET
    if preset not in PRESETS:
        raise SweepError(f"unknown preset {preset!r}; presets: {', '.join(sorted(PRESETS))}")
    bento = runtime == Runtime.BENTOML
    if bento and (asked := sorted(set(raw) & set(CONFIG_FIELDS))):
        raise SweepError(f"a BentoML version is measured as it serves, over concurrency only: "
                         f"{', '.join(asked)} cannot be swept")
    request = {**PRESETS[preset], **{k: v for k, v in raw.items() if k != "preset"}, "preset": preset}

    concurrency = _ints(request, "concurrency", 1, MAX_CONCURRENCY, most=12)
    interval = _int(request, "measurement_interval_ms", 200, 30_000)
    stability = _int(request, "stability_percentage", 1, 100)
    trials = _int(request, "max_trials", WINDOWS_PER_LEVEL, 50)
    budget = _int(request, "time_budget_s", MIN_BUDGET_SECONDS, MAX_BUDGET_SECONDS)
    configs = (ProfileConfig(as_served=True),) if bento else _configs(request, max_batch_size)
    sweep = Sweep(configs=configs, concurrency=tuple(sorted(set(concurrency))), measurement_interval_ms=interval,
                  stability_percentage=stability, max_trials=trials, time_budget_s=budget, request=request)
    if sweep.least_seconds > budget:
        raise SweepError(f"this sweep ({len(configs)} configs × {len(sweep.concurrency)} concurrency levels, "
                         f"{interval} ms windows) needs at least {math.ceil(sweep.least_seconds)} s, more than "
                         f"time_budget_s {budget}: measure fewer configs or levels, or raise the budget")
    return sweep


def _configs(request: dict, version_limit: int) -> tuple[ProfileConfig, ...]:
    counts = _ints(request, "instance_counts", 1, MAX_INSTANCE_COUNT, most=6)
    batching = request.get("dynamic_batching", [False])
    if not isinstance(batching, list) or not batching or not all(isinstance(v, bool) for v in batching):
        raise SweepError("dynamic_batching must be a list of booleans, e.g. [false, true]")
    delay = _int(request, "max_queue_delay_us", 0, 1_000_000)
    if version_limit <= 0:
        if request.get("max_batch_sizes"):
            raise SweepError("max_batch_sizes: this version does not batch (its max_batch_size is 0)")
        return tuple(ProfileConfig(instance_count=n) for n in sorted(set(counts)))
    if request.get("max_batch_sizes"):
        sizes = _ints(request, "max_batch_sizes", 1, version_limit, most=4)
    else:
        sizes = [version_limit]
    preferred = _ints(request, "preferred_batch_sizes", 1, version_limit, most=8) \
        if request.get("preferred_batch_sizes") else []
    configs = []
    for count, on in itertools.product(sorted(set(counts)), sorted(set(batching))):
        if not on:
            configs.append(ProfileConfig(instance_count=count, max_batch_size=version_limit))
            continue
        for size in sorted(set(sizes)):
            if any(p > size for p in preferred):
                raise SweepError(f"preferred_batch_sizes {preferred} must not exceed max_batch_size {size}")
            configs.append(ProfileConfig(instance_count=count, dynamic_batching=True, max_batch_size=size,
                                         preferred_batch_sizes=tuple(sorted(set(preferred))),
                                         max_queue_delay_us=delay))
    if len(configs) > MAX_CONFIGS:
        raise SweepError(f"the sweep makes {len(configs)} configs; at most {MAX_CONFIGS} are measured in one profile")
    return tuple(configs)


def _int(request: dict, name: str, low: int, high: int) -> int:
    value = request.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SweepError(f"{name} must be a whole number from {low} to {high}; got {value!r}")
    return value


def _ints(request: dict, name: str, low: int, high: int, *, most: int) -> list[int]:
    values = request.get(name)
    if not isinstance(values, list) or not 1 <= len(values) <= most or not all(
            isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in values):
        raise SweepError(f"{name} must be a list of 1 to {most} whole numbers from {low} to {high}; got {values!r}")
    return values
