"""Models on demand, the agent's side: load a model registered on demand when a request waits for it at the
gateway, and keep the host's resident on-demand models within a memory budget by evicting the least
recently used first (``runtimes/modelyard_residency.lua`` is the gateway's side).

The loader runs in the agent's main process, beside its Celery worker, in threads:

- the **poller** long-polls the gateway's ``GET /residency/wanted`` (so the gateway knows the loader lives:
  without a poll for 3 s, held requests are answered 503 at once) and queues what it gets;
- the **loading threads** (``--concurrent-loads``, 1 by default, so that loads never compete for the disk, the
  PCIe bus or Triton's load threads with each other) each take one model at a time, make room for it (room made
  and reserved in one step under one lock, so concurrent loads never overcommit the budget), load it from the
  model repository on local disk (its ``config.pbtxt``, which every deployment writes) over Triton's gRPC
  model control where the agent has a gRPC address (HTTP loads stall the HTTP worker thread that takes them,
  ``TritonRuntime``), and report it resident. A model whose footprint is not measured yet loads alone, so
  that the memory its load adds is its own. Between loads the first thread reconciles the gateway's states
  with Triton's repository index every ``SYNC_SECONDS``, so models a restarted Triton no longer holds read
  as cold and come back at their next request.

Memory is measured, never estimated from file size, and the budget holds on each device (each GPU, CPU memory) on
its own: a model's footprint is the one its deployment carries, else what its first load here added on each device,
kept in ``<state dir>/footprints.json`` (``modelyard_agent.footprints``: how it is read and counted). Victims go in
order of least demand (requests decayed with a half-life of 5 minutes), then least recent use, among the models that
hold memory on a device the load needs (``modelyard_agent.eviction``, the policy alone, says why not plain LRU); a
model that is pinned, has requests in flight or held, or is itself being loaded is never evicted. Between loads the
loader keeps the largest footprint free, so a cold load seldom waits for an eviction. When no room can be made, the
load is refused (503 at the gateway) and nothing is overcommitted.

A load that fails is reported with a backoff (1, 2, 4 ... 60 s): until it passes, requests for the model are
answered 503 naming Triton's error, and no new load is tried.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from modelyard_agent.eviction import DemandPolicy, room_victims, too_large
from modelyard_agent.footprints import (
    DEFAULT_METRICS_INTERVAL_MS,
    FOOTPRINTS_FILE,
    Footprint,
    FootprintAccounts,
    describe,
)
from modelyard_agent.loads import load_failure_message, recorded
from modelyard_agent.runtimes.base import ServingRuntimeError
from modelyard_agent.runtimes.residency_control import COLD, EVICTING, RESIDENT
from modelyard_agent.runtimes.triton import TritonRuntime

logger = logging.getLogger(__name__)

SYNC_SECONDS = 2.0
POLL_WAIT_SECONDS = 1.0
DRAIN_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 60.0
NO_ROOM_RETRY_SECONDS = 1.0


class NoRoom(Exception):
    """The budget cannot hold a model: everything resident that would have to leave is pinned or busy."""


class Abandoned(Exception):
    """No request waits for the model any more: it is not loaded."""


@dataclass
class Loaded:
    """A load's outcome: seconds Triton took and the footprint, ``{device: bytes}`` (None: not measured)."""

    seconds: float
    footprint: Footprint | None


class OnDemandLoader(FootprintAccounts):
    """Loads and evicts the models registered on demand on one Triton host.

    Args:
        gateway: the host's ``TritonGateway`` (its ``residency_control`` methods and ``inflight``).
        runtime: the host's Triton (``TritonRuntime`` at ``--triton-url``, with the gRPC address and the load
            deadline).
        budget_bytes: the memory the resident on-demand models may hold together on each device (each GPU, and
            CPU memory), bytes; None: no budget.
        metrics_url: Triton's metrics endpoint, read around each load to measure a footprint; empty: only the
            resident memory of Triton's processes is measured, where the agent sees them.
        metrics_interval_ms: how often Triton refreshes its memory gauges (its ``--metrics-interval-ms``): a load
            is measured once that long has passed since it (or an eviction before it) ended.
        state_dir: where ``footprints.json`` lives.
        model_lock: ``(model, wait=None) -> context manager`` held around each load and eviction (the agent's
            per-(host, model) lock, so no deployment swaps a model while it loads or leaves; ``wait``: seconds to
            wait for it, None for its default); a lock that cannot be had raises ``TimeoutError``.
        unload_timeout: seconds to wait for an evicted model's versions to be gone.
        concurrent_loads: loads that may run at once (loading threads); a model whose footprint is not measured
            yet loads alone (``_load_slot``), so that the memory its load adds is its own.
    """

    def __init__(self, gateway, runtime: TritonRuntime, *, budget_bytes: int | None, metrics_url: str = "",
                 state_dir: Path, model_lock: Callable[[str], AbstractContextManager] | None = None,
                 unload_timeout: float = 120.0, concurrent_loads: int = 1,
                 metrics_interval_ms: int = DEFAULT_METRICS_INTERVAL_MS):
        self.gateway, self.runtime = gateway, runtime
        self.budget = budget_bytes
        self.metrics_url, self.metrics_interval = metrics_url, metrics_interval_ms / 1000
        self.memory_changed_at = float("-inf")  # when a load or an eviction last ended (monotonic)
        self.footprints_file = Path(state_dir) / FOOTPRINTS_FILE
        self.model_lock = model_lock or (lambda model, wait=None: nullcontext())
        self.unload_timeout = unload_timeout
        self.failures: dict[str, int] = {}
        self.policy = DemandPolicy()  # the eviction order (modelyard_agent.eviction)
        self.wanted: queue.Queue[str] = queue.Queue()
        self._stop = threading.Event()
        self._announced = threading.Event()  # the gateway counts this loader as alive
        # Why the budget cannot be held as measured (None: it can), in each budget report (``_budget_report``).
        self.problem: str | None = None
        self._threads: list[threading.Thread] = []
        self.concurrent_loads = max(1, int(concurrent_loads))
        # Loads under way: the models, how many, whether one runs alone and how many wait to; and the bytes each
        # reserved in the budget until Triton reports it READY (``_room`` makes room and reserves as one step).
        self._slots = threading.Condition()
        self._under_way: set[str] = set()
        self._busy, self._alone, self._waiting_alone = 0, False, 0
        self._room = threading.Lock()
        self._reserved: dict[str, Footprint] = {}

    # The threads.

    def start(self, timeout: float = 10.0) -> bool:
        """Start the poller and the loading threads (daemons: they end with the agent's process), and wait up to
        ``timeout`` seconds for the gateway to count this loader as alive, so that a request sent once this
        returns is held for a load rather than answered ``no_loader``.

        Returns:
            True once the gateway counts the loader; False when it did not answer within ``timeout`` (the poller
            keeps trying; held requests are answered ``no_loader`` meanwhile).
        """
        self._stop.clear()
        self._announced.clear()
        self._threads = [threading.Thread(target=self._poll, name="on-demand-poller", daemon=True)] + [
            threading.Thread(target=self._work, args=(index,), name=f"on-demand-loader-{index}", daemon=True)
            for index in range(self.concurrent_loads)]
        for thread in self._threads:
            thread.start()
        return self._announced.wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the threads (a load in progress finishes first)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def _loading(self) -> bool:
        """Whether a loading thread runs: the poller stops polling once none does, so the gateway takes the
        loader for dead (``no_loader``, at once) instead of holding requests that nothing will load."""
        loading = self._threads[1:]
        return not loading or any(t.ident is None or t.is_alive() for t in loading)  # not started counts as alive

    def _poll(self) -> None:
        while not self._stop.is_set():  # what a loader before this one took and left is this one's now
            try:
                self.gateway.forget_taken()
                self._announced.set()
                break
            except ServingRuntimeError as exc:
                logger.debug("on-demand start: %s", exc.message)
                self._stop.wait(0.5)
        while not self._stop.is_set() and self._loading():
            try:
                for model in self.gateway.wanted(wait=POLL_WAIT_SECONDS):
                    self.wanted.put(model)
            except ServingRuntimeError as exc:
                logger.debug("on-demand poll: %s", exc.message)
                self._stop.wait(0.5)

    def _work(self, index: int = 0) -> None:
        """A loading thread: serves wants as they come; the first one also reconciles with Triton every
        ``SYNC_SECONDS`` and keeps headroom between loads."""
        synced = 0.0
        if index == 0:
            try:
                self.problem = self.enforcement_problem()
            except Exception:  # noqa: BLE001 - the loading thread outlives any one failure
                logger.exception("could not check how the on-demand budget is measured")
            if self.problem:
                logger.warning("on-demand memory budget: %s", self.problem)
        while not self._stop.is_set():
            if index == 0 and time.monotonic() - synced >= SYNC_SECONDS:
                try:
                    self.sync()
                except ServingRuntimeError as exc:
                    logger.info("on-demand sync: %s", exc.message)
                except Exception:  # noqa: BLE001 - the loading thread outlives any one failure
                    logger.exception("on-demand sync failed")
                synced = time.monotonic()
            try:
                model = self.wanted.get(timeout=0.2)
            except queue.Empty:
                if index == 0:
                    self._keep_headroom()
                continue
            self.serve(model)

    # What the threads do.

    def sync(self) -> dict[str, str]:
        """Make the gateway's state of each registered model what Triton holds: resident when a version is
        READY, cold otherwise (a restarted Triton, or an unload from elsewhere); models evicting are left alone.

        Returns:
            ``{model: new state}`` for each model whose state changed.

        Raises:
            ServingRuntimeError: Triton or the gateway does not answer.
        """
        held = self.gateway.residency()["models"]
        ready = self._ready()
        changed = {}
        for model, entry in held.items():
            state = RESIDENT if model in ready else COLD
            if entry["state"] != EVICTING and entry["state"] != state:
                changed[model] = state
                self.gateway.report_residency(model, state, budget=self._budget_report(ready))
        return changed

    def serve(self, model: str) -> None:
        """Load ``model`` for the requests held for it and report the outcome to the gateway: resident, or a
        failure (with its backoff) that the gateway answers the held requests with. Never raises: whatever
        fails (Triton, the gateway, the lock's Redis, a model unregistered meanwhile) fails this load only, and
        the next want is served; a want for a model another thread is loading is dropped (that load reports
        it)."""
        with self._slots:
            if model in self._under_way:
                return
            self._under_way.add(model)
        try:
            self._serve(model)
        finally:
            with self._slots:
                self._under_way.discard(model)

    def _serve(self, model: str) -> None:
        try:
            with self.model_lock(model):
                loaded = self.load(model)
        except NoRoom as exc:
            self._report_failure(model, str(exc), NO_ROOM_RETRY_SECONDS)
            return
        except Abandoned as exc:
            logger.info("on-demand load of %s skipped: %s", model, exc)
            return
        except Exception as exc:  # noqa: BLE001 - ServingRuntimeError, TimeoutError, and what nobody foresaw
            count = self.failures[model] = self.failures.get(model, 0) + 1
            backoff = min(MAX_BACKOFF_SECONDS, 2.0 ** (count - 1))
            message = load_failure_message(model, exc)
            log = logger.error if isinstance(exc, ServingRuntimeError | TimeoutError) else logger.exception
            log("on-demand load of %s failed (%d in a row; next try in %g s): %s", model, count, backoff, message)
            self._report_failure(model, message, backoff, getattr(exc, "seconds", None))
            return
        self.failures.pop(model, None)
        logger.info("loaded %s on demand in %.3f s (footprint %s)", model, loaded.seconds, loaded.footprint)

    def _report_failure(self, model: str, message: str, retry_after: float, seconds: float | None = None) -> None:
        try:
            self.gateway.report_residency(model, failure=(message, retry_after), load_seconds=seconds)
        except ServingRuntimeError as exc:
            logger.error("could not report the failed load of %s: %s", model, exc.message)
        except Exception:  # noqa: BLE001 - the loading thread goes on; held requests time out
            logger.exception("could not report the failed load of %s", model)

    def load(self, model: str) -> Loaded:
        """Make room for ``model`` within the budget, load it from the model repository and report it resident.

        Returns:
            The load's seconds and the footprint it counts with, bytes.

        Raises:
            NoRoom: the budget cannot hold it (nothing loaded, nothing evicted beyond what was idle).
            Abandoned: no request is held for it any more (nothing loaded; the gateway's want ended).
            ServingRuntimeError: the model is not registered on demand here, or Triton refused or failed the
                load (its message; the failed entry is unloaded again), or Triton does not answer.
        """
        with self._load_slot(alone=not self.measured(model)):  # what follows reads the host once it may load
            registered = self.gateway.residency()["models"]
            if model not in registered:
                raise ServingRuntimeError(f"{model} is not registered on demand on this host", retryable=False)
            ready = self._ready()
            if model in ready:
                self.gateway.report_residency(model, RESIDENT, budget=self._budget_report(ready))
                return Loaded(0.0, self.footprint(model))
            if not registered[model]["held"]:
                # Every request that wanted it gave up (timed out, refused) while other loads ran: loading it now
                # would only evict models in use. The want ends; a request that comes later wants it again.
                self.gateway.report_residency(model, abandoned=True)
                raise Abandoned(f"no request waits for {model} any more")
            if self.budget is not None:
                with self._room:  # room made and reserved in one step, on what Triton holds now
                    need = self.footprint(model) or self._assumed()
                    self._make_room(model, registered, self._ready(), need=need)
                    self._reserved[model] = need
            try:
                return self._load_now(model)
            finally:
                with self._room:
                    self._reserved.pop(model, None)

    def _load_now(self, model: str) -> Loaded:
        """``load``'s load itself, once room is made: reported resident, then measured (when the model's footprint
        is not known yet: ``_settled_memory`` before and after, so its held requests are served while Triton's
        gauges catch up), with what is over the budget evicted after (a footprint measured larger than
        assumed)."""
        measuring = not self.measured(model)
        before = self._settled_memory() if measuring else None
        started = time.monotonic()
        try:
            with recorded("load", model):
                self.runtime.load(model, None)
        except ServingRuntimeError as exc:
            try:
                self.runtime.unload(model)  # no UNAVAILABLE entry left behind
            except ServingRuntimeError:
                pass
            raise ServingRuntimeError(f"Triton could not load {model}: {exc.message}", retryable=exc.retryable,
                                      timed_out=exc.timed_out, seconds=time.monotonic() - started) from exc
        finally:
            ended = self.memory_changed_at = time.monotonic()
        seconds = ended - started
        with self._room:
            self._reserved.pop(model, None)  # READY now: counted as resident (as assumed until measured)
            self.gateway.report_residency(model, RESIDENT, budget=self._budget_report(self._ready()),
                                          load_seconds=seconds)
        footprint = self._measure(model, before) if measuring else self.footprint(model)
        with self._room:
            ready = self._ready()
            if self.budget is not None and self._overdrawn(ready, {}):
                # Measured larger than assumed: others leave now, so the budget holds again.
                try:
                    self._make_room(None, self.gateway.residency()["models"], ready, keep=model)
                except NoRoom as exc:  # the model serves; what is over the budget leaves once it is idle
                    logger.warning("on-demand budget exceeded after loading %s: %s", model, exc)
            elif self.budget is not None and measuring:  # the budget's figures with what was measured
                self.gateway.report_residency(model, budget=self._budget_report(ready))
        return Loaded(seconds, footprint)

    @contextmanager
    def _load_slot(self, *, alone: bool) -> Iterator[None]:
        """Held around a load. ``alone`` (a model whose footprint is not measured yet) waits until no other load
        runs and keeps the others out until it ends, so that the memory its load adds is its own; any other load
        waits only while one runs alone or waits to. With one loading thread, loads never overlap anyway."""
        with self._slots:
            self._waiting_alone += alone
            self._slots.wait_for(lambda: self._busy == 0 if alone else not self._alone and not self._waiting_alone)
            self._waiting_alone -= alone
            self._busy += 1
            self._alone = self._alone or alone
        try:
            yield
        finally:
            with self._slots:
                self._busy -= 1
                if alone:
                    self._alone = False
                self._slots.notify_all()

    def _ready(self) -> set[str]:
        """The models with a version READY on Triton now."""
        return {entry.name for entry in self.runtime.repository_index() if entry.state == "READY"}

    def evict(self, model: str, reason: str, timeout: float = DRAIN_SECONDS) -> bool:
        """Unload ``model`` once no request is in flight on it, under its lock (``model_lock``: no deployment
        of it is under way); new requests are held meanwhile (state evicting). ``reason`` labels
        ``modelyard_evictions_total``.

        Returns:
            True when it left; False when a deployment of it holds its lock, or requests were still in flight
            after ``timeout`` seconds (it stays resident).

        Raises:
            ServingRuntimeError: Triton or the gateway does not answer.
            Exception: what ``model_lock`` raises when its lock cannot be asked for (the broker's Redis down).
        """
        with ExitStack() as locked:
            try:
                locked.enter_context(self.model_lock(model, wait=0))  # an eviction is optional: never waits
            except TimeoutError as exc:  # a deployment of the model holds its lock
                logger.info("%s not evicted: %s", model, exc)
                return False
            return self._evict(model, reason, timeout)

    def _evict(self, model: str, reason: str, timeout: float) -> bool:
        self.gateway.report_residency(model, EVICTING)
        deadline = time.monotonic() + timeout
        while model in self._flying():
            if time.monotonic() > deadline:
                self.gateway.report_residency(model, RESIDENT)
                return False
            time.sleep(0.005)
        versions = self.runtime.ready_versions(model)
        try:
            with recorded("eviction", model):
                self.runtime.unload(model)
                self.runtime.wait_versions_gone(model, versions, timeout=self.unload_timeout)
        finally:
            self.memory_changed_at = time.monotonic()
        ready = self._ready()
        self.gateway.report_residency(model, COLD, reason=reason, budget=self._budget_report(ready))
        logger.info("evicted %s (%s)", model, reason)
        return True

    def _make_room(self, loading: str | None, registered: dict, ready: set[str], *, need: Footprint | None = None,
                   wait: float = DRAIN_SECONDS, keep: str | None = None) -> set[str]:
        """Evict models of least demand until ``loading`` (None: nothing more), counted as ``need`` (``{device:
        bytes}``), fits in the budget on each device it names, beside the resident models and the loads under way
        (``need`` empty: until everything fits on every device); call with ``_room`` held. The victims are
        ``eviction.room_victims``' choice among the idle ones, in ``victims``' order: a model that frees nothing on
        a device that needs room stays. ``keep`` (the model just loaded, whose lock this thread holds) never goes;
        a model with requests held or in flight, or whose eviction was refused, is passed over, and when the
        idle ones cannot make room it waits for the busy ones up to ``wait`` s (a model whose load just ended
        still has its held requests on their way). Returns the models evicted.

        Raises:
            NoRoom: what would have to leave is pinned or busy, or the model alone is larger than the budget.
        """
        need = need or {}
        if too_large(need, self.budget):
            raise NoRoom(f"{loading} needs {describe(need)}, more than this host's on-demand memory budget of "
                         f"{self.budget} bytes per device")
        resident = {m for m in ready if m in registered}
        evicted: set[str] = set()
        passed: set[str] = set()  # evictions refused since the last wait (lock held, requests still in flight)
        deadline = time.monotonic() + wait
        while over := self._overdrawn(resident, need, loading):
            with self._slots:
                under_way = set(self._under_way)
            order = self.victims(registered, resident - {loading, keep} - under_way)
            flying = self._flying()
            idle = [m for m in order if m not in passed and not registered[m]["held"] and m not in flying]
            chosen = room_victims(need, self._held(resident, loading), idle, self.budget)
            if chosen:
                for victim in chosen:
                    if not self.evict(victim, "budget"):
                        passed.add(victim)
                        break
                    evicted.add(victim)
                    resident.discard(victim)
                continue
            if len(idle) == len(order) or time.monotonic() > deadline:
                raise NoRoom(f"no room for {loading or 'the models resident'} in this host's on-demand memory "
                             f"budget of {self.budget} bytes per device (with it: {describe(over)}): the rest is held "
                             f"by models pinned or busy ({', '.join(sorted(resident))})")
            time.sleep(0.01)
            passed.clear()  # a lock released or requests done since: tried again
            registered = self.gateway.residency()["models"]
            resident &= set(registered)  # one unregistered meanwhile is always resident, outside the budget
        return evicted

    def victims(self, registered: dict, resident: set[str]) -> list[str]:
        """The resident models that may be evicted (not pinned), in the order they go (``eviction.DemandPolicy``:
        least demand first, then least recently used), once the policy has observed each registered model's
        request count."""
        now = time.monotonic()
        self.policy.observe({m: int(entry.get("requests") or 0) for m, entry in registered.items()}, now)
        return self.policy.victims((m for m in resident if m in registered and not registered[m]["pinned"]),
                                   {m: registered[m]["last_used"] for m in resident if m in registered}, now)

    def _keep_headroom(self) -> None:
        """Between loads: evict the models of least demand until the largest footprint fits, on each device, in
        what is left of the budget, so that the next cold load does not wait for an eviction; not while a load
        is measured (it runs alone). Never raises (logged)."""
        if self.budget is None or self._alone:
            return
        try:
            with self._room:
                registered = self.gateway.residency()["models"]
                ready = self._ready()
                largest = self._largest_footprint()
                if self._overdrawn({m for m in ready if m in registered}, largest):
                    self._make_room(None, registered, ready, need=largest, wait=0)
        except NoRoom:
            pass  # what is resident is pinned or busy: the next load makes room, or says why not
        except ServingRuntimeError as exc:
            logger.info("on-demand headroom: %s", exc.message)
        except Exception:  # noqa: BLE001 - the loading thread outlives any one failure
            logger.exception("on-demand headroom failed")

    def _flying(self) -> set[str]:
        """The models with a request in flight now (the gateway's counters)."""
        return {key.split("/")[0] for key, count in self.gateway.inflight().items() if count > 0}

