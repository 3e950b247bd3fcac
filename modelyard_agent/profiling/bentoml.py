"""Profiling one BentoML version on its host, beside what the host serves.

The version is imported into the host's Bento Store (as a deployment does) and a ``bentoml serve``
instance of its own is started on a free loopback port, under the profile's model name
(``profiling.triton.profile_model_name``); nginx never routes to it, so the served instances and
their clients are untouched. wrk posts the version's sample input to the first API route at each
concurrency level. The memory is the instance's resident set (its whole process group, from
``/proc``) once ready. The instance is stopped and its home removed when the sweep ends.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from modelyard_agent.bentoml_import import import_into_store
from modelyard_agent.contract import BENTO
from modelyard_agent.formats.names import PROFILE_INFIX
from modelyard_agent.profiling import perf_analyzer, wrk
from modelyard_agent.profiling.perf_analyzer import LoadGeneratorError, Stopped
from modelyard_agent.profiling.sweep import Sweep
from modelyard_agent.profiling.triton import profile_id_of, profile_model_name
from modelyard_agent.runtimes import bentoml as serve
from modelyard_agent.runtimes.base import ServingRuntimeError, StagingError
from modelyard_agent.runtimes.bento_store import BentoStore

logger = logging.getLogger(__name__)


def profile_bentoml_version(
    payload: dict,
    *,
    root: Path,
    wrk_binary: str,
    progress: Callable[[list[dict], str], None],
    should_stop: Callable[[], str | None],
    load_timeout: float = 600.0,
    unload_timeout: float = 120.0,
) -> dict:
    """Measure ``payload``'s Bento over its sweep's concurrency levels; never raises.

    Args:
        payload: a ``contract.ProfilePayload`` of a Bento (signature with ``bentoml.tag`` and
            ``bentoml.apis``; a ``sample_input``, which is the request body).
        root: the agent's BentoML directory.
        wrk_binary: the wrk to run.
        progress, should_stop: as ``profiling.triton.profile_triton_version``.
        load_timeout, unload_timeout: seconds for the import and start, and for the stop.

    Returns:
        As ``profile_triton_version``: ``{"status", "rows", "message", "details"}``.
    """
    started = time.monotonic()
    sweep = Sweep.from_dict(payload["sweep"])
    deadline = started + sweep.time_budget_s
    rows: list[dict] = []
    name = profile_model_name(payload["model"], int(payload["profile_id"]))
    details: dict = {"model_name": name}

    def result(status: str, message: str = "") -> dict:
        details["seconds"] = round(time.monotonic() - started, 3)
        return {"status": status, "rows": rows, "message": message, "details": details}

    signature = payload.get("signature") or {}
    bento = signature.get("bentoml") or {}
    apis = bento.get("apis") or []
    if payload.get("format") != BENTO or not apis:
        return result("failed", "only a Bento with an API can be profiled (a Bento model has no service)")
    if not payload.get("sample_input"):
        return result("failed", "the version has no sample_input: it is the request body wrk sends")
    try:
        binary = perf_analyzer.find_binary(wrk_binary, "wrk")
    except LoadGeneratorError as exc:
        return result("failed", str(exc))
    progress(rows, "importing the Bento")
    store = BentoStore(root)
    try:
        import_into_store(payload, store, kind=BENTO, tag=bento.get("tag", ""), timeout=load_timeout)
    except StagingError as exc:
        return result("failed", exc.message)
    instance = serve.plan_instance(root, store.home, model=name, version=int(payload["version"]), tag=bento["tag"])
    workdir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=instance.home))
    config = sweep.configs[0]
    try:
        instance = serve.start_ready(instance, load_timeout, lambda started: None)
        # One request before the levels: a service's first answer pays for its lazy start (model
        # load, first batch), which would otherwise fill a short level and measure nothing.
        serve.smoke_request(instance, payload["sample_input"], signature, timeout=load_timeout)
        details["load_seconds"] = round(time.monotonic() - started, 3)
        base = {"config": config.as_dict(), "memory_bytes": _resident_bytes(instance), "memory_kind": "cpu"}
        script, body = workdir / "report.lua", workdir / "body.json"
        script.write_text(wrk.REPORT_SCRIPT)
        body.write_text(json.dumps(payload["sample_input"]))
        url = f"{instance.url}{apis[0].get('route') or '/' + apis[0]['name']}"
        for concurrency in sweep.concurrency:
            progress(rows, f"concurrency {concurrency}")
            log_path = workdir / f"c{concurrency}.log"
            row = {**base, "concurrency": concurrency}
            try:
                perf_analyzer.run(wrk.command(binary, url=url, concurrency=concurrency, seconds=(
                    3 * sweep.measurement_interval_ms / 1000), script=script, body=body),
                    deadline=deadline, should_stop=should_stop, log_path=log_path)
                row.update(wrk.read_report(log_path))
            except LoadGeneratorError as exc:
                row["error"] = str(exc)
            rows.append(row)
            progress(rows, f"concurrency {concurrency}")
        return result("succeeded")
    except ServingRuntimeError as exc:
        instance = exc.instance if isinstance(exc, serve.StartFailed) else instance
        return result("failed", f"the profiling instance did not start: {exc.message}")
    except Stopped as exc:
        cancelled = "time budget" not in exc.reason
        return result("cancelled" if cancelled else "failed", exc.reason)
    finally:
        try:
            if instance.pid:
                serve.stop_instance(instance, timeout=unload_timeout)
        except ServingRuntimeError as exc:
            logger.error("could not stop profiling instance %s: %s", name, exc.message)
        shutil.rmtree(instance.home, ignore_errors=True)


def stop_stale_instances(root: Path, active: set[int], timeout: float = 30.0) -> list[str]:
    """Stop and delete the profiling instances no running profile owns (an agent killed mid-profile
    leaves its ``bentoml serve`` running in a session of its own).

    Args:
        root: the agent's BentoML directory.
        active: the ids of the profiles this host's agent is running now.
        timeout: seconds to wait for each instance to stop.

    Returns:
        The instance homes removed.
    """
    removed = []
    for home in sorted((Path(root) / "instances").glob(f"*{PROFILE_INFIX}*")):
        model = home.name.rsplit("-v", 1)[0]
        profile = profile_id_of(model)
        if profile is None or profile in active:
            continue
        try:  # port 0: the instance's port is not recorded, and stopping its processes frees it
            serve.stop_instance(serve.Instance(model=model, version=0, tag="", port=0, home=str(home)), timeout=timeout)
        except ServingRuntimeError as exc:
            logger.error("could not stop profiling instance %s: %s", home.name, exc.message)
            continue
        shutil.rmtree(home, ignore_errors=True)
        logger.warning("removed profiling instance %s, which no running profile owns", home.name)
        removed.append(str(home))
    return removed


def _resident_bytes(instance: serve.Instance) -> int | None:
    """The resident set of every process of the instance (``/proc/<pid>/statm``), bytes; None when
    ``/proc`` cannot be read."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    try:
        for pid in serve.processes_of(instance.home):
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * page
    except (OSError, ValueError, IndexError):
        return None
    return total or None
