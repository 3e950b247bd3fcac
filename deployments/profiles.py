"""Performance cards: profiling a model version on a host, and the figures the rest of the fleet uses.

A profile is an agent task (``modelyard_agent.contract.AgentTask.PROFILE``): the host's agent loads
a copy of the version under a name of its own for each config of the sweep and measures it with
Triton's perf_analyzer (wrk for BentoML), reporting rows as it goes
(``OrchestratorTask.PROFILE_REPORT``, recorded by ``record_profile_report``). One profile runs on a
host at a time. The card's figures feed:

- rollouts: ``"config": "recommended"`` (``recommended_overrides``);
- placement: the measured GPU memory of a version that has no footprint from a real load yet
  (``card_gpu_bytes``);
- the autoscaler: default instance bounds (``card_instance_bounds``);
- promotion: the ``max_profile_regression`` gate (``promotions.gates``).
"""

from __future__ import annotations

import logging
from functools import partial

from django.db import transaction

from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from deployments import agent_jobs
from deployments.choices import RUNTIME_FORMATS, JobStatus
from deployments.enqueue import Job, job
from deployments.models import Profile, ServingHost
from modelyard.celery import require_broker
from modelyard.errors import Conflict, InvalidInput, NotFound
from modelyard_agent.contract import PROFILE_PROTOCOL, AgentTask, Runtime
from modelyard_agent.formats.triton_config import ModelConfigError, instance_groups_of, parse_model_config
from modelyard_agent.profiling.card import measured, pareto_front, throughput_at
from modelyard_agent.profiling.sweep import ProfileConfig, SweepError, parse_sweep
from registry.choices import VersionStatus
from registry.models import ModelVersion
from registry.versions import get_version

logger = logging.getLogger(__name__)

def _report_fields(profile: Profile, report: dict, ended: bool) -> dict:
    """A profile report's own columns: every row measured so far, and at the end its ``details``."""
    return {"rows": list(report.get("rows") or []), **({"details": dict(report.get("details") or {})} if ended else {})}


PROFILE_JOBS = agent_jobs.JobKind(
    name="profile", model=Profile, task=AgentTask.PROFILE, related=(), payload=lambda profile: {"sweep": profile.sweep},
    report_fields=_report_fields, cancel_action=AuditAction.PROFILE_CANCELLED,
    budget_fields=("sweep",), budget=lambda profile: float(profile.sweep.get("time_budget_s") or 0))


def start_profile(*, model_name: str, version: int, host_name: str, sweep=None, slo_p99_ms: float | None = None,
                  actor=None, authorize=None) -> Profile:
    """Queue a profile of one model version on one host.

    Args:
        model_name, version: the model version to measure.
        host_name: the host to measure it on (a staging host, typically); its agent must speak
            protocol ``PROFILE_PROTOCOL`` or newer.
        sweep: a sweep object, a preset's name, or None (``modelyard_agent.profiling.sweep``).
        slo_p99_ms: the client p99 target (milliseconds) the recommendation is chosen for.
        actor: the requesting user.
        authorize: ``authorize(model_version, hosts)``; raises to refuse (as for a rollout).

    Returns:
        The new Profile, QUEUED; it is sent to the host's agent once the transaction commits.

    Raises:
        NotFound: no such model, version or host.
        InvalidInput: a bad sweep or SLO, or a version that is not READY.
        Conflict: the host's runtime cannot serve the version, its agent is too old or never
            reported, or another profile runs on the host.
    """

    model_version = get_version(model_name, version)
    host = ServingHost.objects.filter(name=host_name).first()
    if host is None:
        raise NotFound(f"no serving host named {host_name!r}")
    if authorize is not None:
        authorize(model_version, [host])
    if model_version.status != VersionStatus.READY:
        raise InvalidInput(f"{model_version} is {model_version.status}; only a READY version can be profiled")
    if model_version.format not in RUNTIME_FORMATS.get(host.runtime, frozenset()):
        raise Conflict(f"{model_name} v{version} is a {model_version.get_format_display()}, which {host.name!r} "
                       f"({host.get_runtime_display()}) cannot serve")
    agent = (host.heartbeat or {}).get("agent") or {}
    if not host.last_heartbeat_at:
        raise Conflict(f"the agent of host {host.name!r} never reported; start it (modelyard-agent --host "
                       f"{host.name}) before profiling there")
    if int(agent.get("protocol") or 1) < PROFILE_PROTOCOL:
        raise Conflict(f"the agent of host {host.name!r} speaks protocol {agent.get('protocol') or 1}; profiles "
                       f"need {PROFILE_PROTOCOL}: upgrade it (pip install -U ./modelyard_agent)")
    if slo_p99_ms is not None and (isinstance(slo_p99_ms, bool) or not isinstance(slo_p99_ms, int | float)
                                   or not 0 < slo_p99_ms <= 600_000):
        raise InvalidInput(f"slo_p99_ms must be a number of milliseconds above 0; got {slo_p99_ms!r}")
    try:
        checked = parse_sweep(sweep, max_batch_size=_max_batch_size(model_version), runtime=host.runtime)
    except SweepError as exc:
        raise InvalidInput(f"sweep: {exc}") from exc
    require_broker("the profile")
    with transaction.atomic():
        agent_jobs.refuse_a_second(PROFILE_JOBS, host)
        profile = Profile.objects.create(version=model_version, host=host, sweep=checked.as_dict(),
                                         slo_p99_ms=slo_p99_ms, created_by=acting_user(actor))
        record_audit_event(action=AuditAction.PROFILE_STARTED, actor=actor, obj_type="profile", obj_id=profile.pk,
                           model=model_version.model,
                           data={"version": model_version.version, "host": host.name, "runs": checked.runs,
                                 "preset": checked.request.get("preset"), "slo_p99_ms": slo_p99_ms})
        transaction.on_commit(lambda: job(Job.DISPATCH_PROFILE, profile.pk))
    return profile


def _max_batch_size(version: ModelVersion) -> int:
    if version.format in RUNTIME_FORMATS[Runtime.BENTOML]:
        return 0
    try:
        return int(parse_model_config(version.config_text or "").max_batch_size)
    except ModelConfigError as exc:
        raise InvalidInput(f"{version}'s config.pbtxt does not parse: {exc}") from exc


# The agent-job operations (``deployments.agent_jobs``: payload, cancel, report, stall) bound to
# profiles; the API, the pages, the orchestrator's tasks and the reconciler call these.
build_profile_payload = partial(agent_jobs.build_payload, PROFILE_JOBS)
cancel_profile = partial(agent_jobs.cancel, PROFILE_JOBS)
record_profile_report = partial(agent_jobs.record_report, PROFILE_JOBS)
fail_stalled_profiles = partial(agent_jobs.fail_stalled, PROFILE_JOBS)


def card_for(version: ModelVersion, host: ServingHost | None = None) -> Profile | None:
    """The newest finished profile of ``version`` (on ``host``, when given) that measured something."""
    profiles = Profile.objects.filter(version=version, status=JobStatus.SUCCEEDED)
    if host is not None:
        profiles = profiles.filter(host=host)
    return next((p for p in profiles.order_by("-finished_at", "-id")[:10] if measured(p.rows)), None)


def recommended_overrides(version: ModelVersion) -> dict:
    """The deployment ``config_overrides`` of the config the version's card recommends.

    Raises:
        InvalidInput: the version has no card, or no config of it met its SLO.
    """
    card = card_for(version)
    if card is None:
        raise InvalidInput(f"{version} has no performance card: profile it first "
                           f"(POST /api/v1/models/{version.model.name}/versions/{version.version}/profiles/)")
    best = card.recommended
    if best is None:
        raise InvalidInput(f"no config of {version}'s card (profile {card.pk}) met its p99 target of "
                           f"{card.slo_p99_ms:g} ms; give config_overrides yourself")
    return overrides_for(version, best["config"])


def overrides_for(version: ModelVersion, config: dict) -> dict:
    """The deployment ``config_overrides`` that serve ``version`` with a card's ``config``
    (``ProfileConfig.as_dict``); ``{}`` for a BentoML version, measured as it serves."""
    return ProfileConfig.from_dict(config).config_overrides(instance_groups_of(version.config_text or ""))


def profile_comparison(candidate: ModelVersion, target: ModelVersion) -> dict:
    """The two versions' measured throughput where the target's card recommends serving it.

    The target version's newest card gives the host, the config and the concurrency (its
    recommendation); the candidate's newest card on that host must hold a measurement of the same
    config at the same concurrency.

    Returns:
        ``{"host", "config_key", "config_label", "concurrency", "target_profile", "candidate_profile",
        "target_throughput", "candidate_throughput"}`` (inferences/s), or ``{"missing": sentence}``
        saying which card or measurement is lacking.
    """

    target_card = card_for(target)
    best = target_card.recommended if target_card else None
    if best is None:
        return {"missing": f"v{target.version} (the target) has no performance card with a recommendation"}
    host = target_card.host
    key, concurrency = best["config"].get("key"), best["concurrency"]
    label = best["config"].get("label", key)
    candidate_card = card_for(candidate, host)
    value = throughput_at(candidate_card.rows, key, concurrency) if candidate_card else None
    if value is None:
        return {"missing": f"v{candidate.version} has no performance card on {host.name} measuring {label} at "
                           f"concurrency {concurrency} (profile it there with that config)"}
    return {"host": host.name, "config_key": key, "config_label": label, "concurrency": concurrency,
            "target_profile": target_card.pk, "candidate_profile": candidate_card.pk,
            "target_throughput": float(best["throughput"]), "candidate_throughput": value}


CARDS_COMPARED = 200  # succeeded profiles read for a comparison of two versions, newest first


def _card_summary(profile: Profile) -> dict:
    """What the compare page and API show of one card: its recommendation and how it was measured."""
    best = profile.recommended
    recommended = None
    if best is not None:
        row = next((r for r in measured(profile.rows) if r["concurrency"] == best["concurrency"]
                    and (r.get("config") or {}).get("key") == best["config"].get("key")), {})
        recommended = {"config_key": best["config"].get("key"), "config_label": best["config"].get("label", ""),
                       "concurrency": best["concurrency"], "throughput": float(best["throughput"]),
                       "p99_ms": float(best["p99_ms"]), "memory_bytes": best.get("memory_bytes"),
                       "memory_kind": row.get("memory_kind")}
    return {"profile": profile.pk, "finished_at": profile.finished_at.isoformat() if profile.finished_at else None,
            "slo_p99_ms": profile.slo_p99_ms, "measurements": len(measured(profile.rows)),
            "recommended": recommended}


def _ratio(a: dict | None, b: dict | None, numbers: tuple[int, int], host: str) -> tuple[dict | None, str]:
    if a is None or b is None:
        missing = numbers[0] if a is None else numbers[1]
        return None, f"v{missing} has no card on {host}"
    for number, card in zip(numbers, (a, b), strict=True):
        if card["recommended"] is None:
            return None, (f"no config of v{number}'s card on {host} met its p99 target of "
                          f"{card['slo_p99_ms']:g} ms")
    best_a, best_b = a["recommended"], b["recommended"]
    return {"throughput": best_b["throughput"] / best_a["throughput"] if best_a["throughput"] else None,
            "p99": best_b["p99_ms"] / best_a["p99_ms"] if best_a["p99_ms"] else None,
            "same_config": (best_a["config_key"], best_a["concurrency"]) == (best_b["config_key"],
                                                                           best_b["concurrency"]),
            "same_slo": a["slo_p99_ms"] == b["slo_p99_ms"]}, ""


def compare_cards(a: ModelVersion, b: ModelVersion) -> dict:
    """Two versions' performance cards side by side, host by host (the compare page and API).

    For each version, its newest finished profile on each host that measured something (as
    :func:`card_for` picks one per host); a host appears when either version has a card there.
    Where both have one, ``ratio`` compares what each card recommends (each at its own recommended
    config and concurrency, as ``"config": "recommended"`` would serve it): ``throughput`` is b's
    inferences/s over a's, ``p99`` b's p99 over a's (above 1: b is slower); ``same_config`` says
    whether both recommend the same config at the same concurrency, ``same_slo`` whether both were
    chosen for the same p99 target. ``promotions``' ``max_profile_regression`` gate compares at one
    config instead (:func:`profile_comparison`).

    Args:
        a: the version in use (the one replaced).
        b: the version that replaces it (same model).

    Returns:
        ``{"hosts": [{"host", "runtime", "a", "b", "ratio", "why_no_ratio"}], "missing": {"a", "b"}}``:
        ``a``/``b`` a card (``{"profile"`` id, ``"finished_at"`` ISO 8601, ``"slo_p99_ms"``,
        ``"measurements"``, ``"recommended": {"config_key", "config_label", "concurrency",
        "throughput"`` (inferences/s), ``"p99_ms"``, ``"memory_bytes"``, ``"memory_kind"`` (cpu, gpu)}
        or None when no config met the target}, or None where the version has no card on that host;
        ``ratio`` ``{"throughput", "p99", "same_config", "same_slo"}`` or None, with ``why_no_ratio``
        saying why; hosts by name. ``missing.a``/``missing.b``: a sentence on how to profile a version
        that has no card anywhere, else "". One SQL query.
    """
    cards: dict[int, dict[str, Profile]] = {a.pk: {}, b.pk: {}}
    hosts: dict[str, ServingHost] = {}
    profiles = (Profile.objects.filter(version__in=[a.pk, b.pk], status=JobStatus.SUCCEEDED)
                .select_related("host").order_by("-finished_at", "-id")[:CARDS_COMPARED])
    for profile in profiles:
        per_host = cards[profile.version_id]
        if profile.host.name not in per_host and measured(profile.rows):
            per_host[profile.host.name] = profile
            hosts[profile.host.name] = profile.host
    rows = []
    for name in sorted(hosts):
        card_a, card_b = (_card_summary(cards[v.pk][name]) if name in cards[v.pk] else None for v in (a, b))
        ratio, why = _ratio(card_a, card_b, (a.version, b.version), name)
        rows.append({"host": name, "runtime": hosts[name].runtime, "a": card_a, "b": card_b, "ratio": ratio,
                     "why_no_ratio": why})
    model = a.model.name
    missing = {key: "" if cards[v.pk] else (
        f"v{v.version} has no performance card: profile it from its page, or with "
        f"`modelyard profile {model} {v.version} --host <host> --wait` "
        f"(POST /api/v1/models/{model}/versions/{v.version}/profiles/)") for key, v in (("a", a), ("b", b))}
    return {"hosts": rows, "missing": missing}


def comparison_panel(a: ModelVersion, b: ModelVersion, **_) -> dict:
    """The compare page's "Performance cards" section: connected to ``registry.signals.comparison_panels``.

    Returns:
        ``{"template": the partial, "context": {"hosts": compare_cards(a, b)["hosts"], each with
        ``pair``: ``[{"version": a, "card"}, {"version": b, "card"}]``, "sides": [{"version", "missing"}]}}``.
    """
    cards = compare_cards(a, b)
    hosts = [{**row, "pair": [{"version": a, "card": row["a"]}, {"version": b, "card": row["b"]}]}
             for row in cards["hosts"]]
    sides = [{"version": v, "missing": bool(cards["missing"][key])} for key, v in (("a", a), ("b", b))]
    return {"template": "deployments/partials/compare_profiles.html", "context": {"hosts": hosts, "sides": sides}}


def card_gpu_bytes(version: ModelVersion) -> int | None:
    """The GPU memory (bytes) the version's card measured for its recommended config (else the
    most any config took), or None when the card measured no GPU memory (a CPU host)."""
    card = card_for(version)
    if card is None:
        return None
    rows = [row for row in measured(card.rows) if row.get("memory_kind") == "gpu" and row.get("memory_bytes")]
    best = card.recommended
    chosen = [row for row in rows if best and row["config"].get("key") == best["config"].get("key")]
    figures = [int(row["memory_bytes"]) for row in (chosen or rows)]
    return max(figures) if figures else None


def card_instance_bounds(version: ModelVersion) -> tuple[int, int] | None:
    """Default autoscaler bounds from the version's card: ``(min_instances, max_instances)``.

    The minimum is the recommended config's instance count; the maximum is the largest instance
    count whose measurements still met the card's SLO (the card has no evidence that more help).
    None without a card or a recommendation.
    """
    card = card_for(version)
    best = card.recommended if card else None
    if best is None:
        return None
    low = int(best["config"].get("instance_count", 1))
    within = [int(row["config"].get("instance_count", 1)) for row in measured(card.rows)
              if card.slo_p99_ms is None or row["p99_ms"] <= card.slo_p99_ms]
    return low, max([low, *within])


def profile_progress(profile: Profile) -> dict:
    """``{"done": rows measured, "total": runs in the sweep, "step": what the agent does now}``."""
    done = sum(1 for row in profile.rows if row.get("concurrency") is not None or row.get("error"))
    return {"done": done, "total": profile.runs, "step": profile.step}


# The p99 target is drawn on a card's chart only when it lies within this many times the widest measured p99:
# farther out, the axis would follow the target and squash every point against zero.
TARGET_REACH = 1.5


def card_context(profile: Profile) -> dict:
    """What the card panel shows of ``profile``.

    Returns:
        ``{"rows": [row + {"on_front", "recommended"}], "recommended": dict | None,
        "recommended_overrides": JSON text | "", "chart": {"configs": [{"key", "label", "points":
        [{"x": p99_ms, "y": throughput, "concurrency"}]}], "front": [{"x", "y"}], "slo_p99_ms", "target_drawn":
        whether the target lies within ``TARGET_REACH`` times the widest measured p99, so the axis fits the data},
        "chart_id": the id of the chart's JSON element, "progress": {...},
        "summary": a sentence describing the chart, its text alternative}``.
    """
    import json

    best = profile.recommended
    front = pareto_front(profile.rows)
    front_ids = {id(row) for row in front}
    rows = [{**row, "on_front": id(row) in front_ids,
             "recommended": bool(best) and row.get("concurrency") == best["concurrency"]
             and (row.get("config") or {}).get("key") == best["config"].get("key")} for row in profile.rows]
    configs: dict[str, dict] = {}
    for row in measured(profile.rows):
        entry = configs.setdefault(row["config"]["key"], {"key": row["config"]["key"],
                                                           "label": row["config"].get("label", ""), "points": []})
        entry["points"].append({"x": row["p99_ms"], "y": row["throughput"], "concurrency": row["concurrency"]})
    widest = max((point["x"] for entry in configs.values() for point in entry["points"]), default=0)
    overrides = overrides_for(profile.version, best["config"]) if best else None
    if front:
        top = max(front, key=lambda row: row["throughput"])
        summary = (f"{len(measured(profile.rows))} measurements of {len(configs)} configs; the Pareto front has "
                   f"{len(front)} points, from {front[0]['throughput']:,.0f} inferences/s at p99 "
                   f"{front[0]['p99_ms']:.2f} ms to {top['throughput']:,.0f} inferences/s at p99 "
                   f"{top['p99_ms']:.2f} ms.")
    else:
        summary = "Nothing measured yet."
    return {"rows": rows, "recommended": best, "recommended_overrides": json.dumps(overrides) if overrides else "",
            "chart": {"configs": list(configs.values()), "front": [{"x": r["p99_ms"], "y": r["throughput"]}
                                                                   for r in front],
                      "slo_p99_ms": profile.slo_p99_ms,
                      "target_drawn": bool(profile.slo_p99_ms) and profile.slo_p99_ms <= widest * TARGET_REACH},
            "chart_id": f"profile-chart-{profile.pk}", "progress": profile_progress(profile), "summary": summary}
