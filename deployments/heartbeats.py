"""Host heartbeats: store each agent's report on its host, stamped with when the runtime came back and
since when each model version has been loading or unloading; read back what the last one says of the models
held on demand (``residency_report``, ``budget_problem``).
"""

from django.db import transaction
from django.utils import timezone

from deployments.models import ServingHost
from modelyard.errors import InvalidInput


def record_heartbeat(host_name: str, report: dict) -> bool:
    """Store what a host agent reported (``modelyard_agent.contract.HeartbeatReport``) with the time it arrived.

    Model versions in a transitional state (LOADING, UNLOADING) get ``since``: the time a report first
    showed them so.

    Returns:
        False when the host is unknown (deleted since the request went out), else True.
    """
    if not isinstance(report, dict):
        raise InvalidInput("a heartbeat report is a JSON object")
    now = timezone.now()
    with transaction.atomic():
        host = ServingHost.objects.select_for_update().filter(name=host_name).only("heartbeat").first()
        if host is None:
            return False
        report = _with_runtime_back_at(host.heartbeat or {}, _with_transition_times(host.heartbeat or {}, report, now),
                                       now)
        ServingHost.objects.filter(pk=host.pk).update(last_heartbeat_at=now, heartbeat=report)
    return True


def _with_runtime_back_at(previous: dict, report: dict, now) -> dict:
    """Stamp ``runtime_back_at`` (ISO 8601): when a report first showed the runtime live after one that
    showed it not live, kept from report to report. The reconciler does not hold a failed repair
    against a version when the failure came before the runtime's last return (``reconcile_host``)."""
    if report.get("runtime_live") and previous.get("runtime_live") is False:
        return {**report, "runtime_back_at": now.isoformat()}
    if report.get("runtime_live") and previous.get("runtime_back_at"):
        return {**report, "runtime_back_at": previous["runtime_back_at"]}
    return report


# States a runtime passes through on the way to READY or gone; a version that stays in one is stuck.
TRANSITIONAL_STATES = ("LOADING", "UNLOADING")


def _with_transition_times(previous: dict, report: dict, now) -> dict:
    """Stamp each model version the report shows LOADING or UNLOADING with ``since``: when a report
    first showed it in that state (kept from the previous report while the state lasts), so that
    ``ServingHost.stuck_versions`` can tell a slow load from one that never ends."""
    models = report.get("models")
    if not isinstance(models, list):
        return report
    seen = {(m.get("name"), m.get("version"), m.get("state")): m.get("since")
            for m in (previous.get("models") or []) if isinstance(m, dict)}
    stamped = []
    for entry in models:
        if isinstance(entry, dict) and entry.get("state") in TRANSITIONAL_STATES:
            key = (entry.get("name"), entry.get("version"), entry.get("state"))
            entry = {**entry, "since": seen.get(key) or now.isoformat()}
        stamped.append(entry)
    return {**report, "models": stamped}


# What a model's entry in the gateway's residency report holds (modelyard_residency.lua's snapshot), in order.
RESIDENCY_FIELDS = ("state", "pinned", "held", "requests", "last_used", "wanted", "failure", "cold_start_timeout",
                    "max_held")


def budget_problem(host: ServingHost) -> str:
    """Why the host's on-demand memory budget cannot be held as measured, as its agent last reported it
    (``modelyard_agent.residency.OnDemandLoader.enforcement_problem``), or ""."""
    return _problem(_budget(_residency(host)))


def budget_bytes(host: ServingHost) -> int | None:
    """The on-demand memory budget, bytes per device, that ``host``'s agent last reported (None: none reported)."""
    size = _budget(_residency(host)).get("budget_bytes")
    return int(size) if isinstance(size, int | float) and not isinstance(size, bool) else None


def residency_report(host: ServingHost, visible) -> dict:
    """Models on demand on ``host`` as its last heartbeat reported them (``gateway.residency``).

    Args:
        host: the serving host.
        visible: a function from a set of model names to those the caller may read; the others are left out, as
            if absent.

    Returns:
        ``{"host", "reported_at" (the heartbeat's time, or None), "budget": {"budget_bytes" (each device's),
        "resident_bytes" (on the fullest device; bytes, None when not reported), "devices" ({device: bytes held},
        a GPU by its uuid or "cpu", by name; {} when not reported), "problem" (why the budget cannot be held as
        measured, or "")},
        "models": [{"model", "state" (resident, cold or evicting), "pinned", "held" (requests held now),
        "requests" (since the gateway started), "last_used" (epoch seconds, or None), "wanted", "failure"
        ({message, retry_after} of the last failed load, or None), "cold_start_timeout" (seconds), "max_held"}]}``,
        models by name. A host that holds no model on demand, or has not reported, has none.
    """
    residency = _residency(host)
    models = _models(residency)
    budget = _budget(residency)
    shown = set(visible({name for name, entry in models.items() if isinstance(entry, dict)})) if models else set()
    return {
        "host": host.name,
        "reported_at": host.last_heartbeat_at,
        "budget": {"budget_bytes": budget.get("budget_bytes"), "resident_bytes": budget.get("resident_bytes"),
                   "devices": _devices(budget), "problem": _problem(budget)},
        "models": [{"model": name, **{field: entry.get(field) for field in RESIDENCY_FIELDS}}
                   for name, entry in sorted(models.items()) if name in shown],
    }


def residency_states(host_names: set[str]) -> dict[str, dict[str, str]]:
    """Each host's models on demand with their state (resident, cold or evicting) as its last heartbeat reported
    them, by the name each has on the host's runtime: ``{host: {runtime name: state}}``; one SQL query."""
    states = {}
    for name, heartbeat in ServingHost.objects.filter(name__in=host_names).values_list("name", "heartbeat"):
        states[name] = {model: entry.get("state") for model, entry in _models(_residency_of(heartbeat)).items()
                        if isinstance(entry, dict)}
    return states


def on_demand_names(host: ServingHost) -> set[str]:
    """The names (on the host's runtime) of the models ``host``'s gateway last reported registered on demand."""
    return set(_models(_residency(host)))


def _residency(host: ServingHost) -> dict:
    return _residency_of(host.heartbeat)


def _residency_of(heartbeat: dict | None) -> dict:
    gateway = heartbeat.get("gateway") if isinstance(heartbeat, dict) else None
    residency = gateway.get("residency") if isinstance(gateway, dict) else None
    return residency if isinstance(residency, dict) else {}


def _models(residency: dict) -> dict:
    models = residency.get("models")
    return models if isinstance(models, dict) else {}


def _budget(residency: dict) -> dict:
    budget = residency.get("budget")
    return budget if isinstance(budget, dict) else {}


def _devices(budget: dict) -> dict[str, int]:
    devices = budget.get("devices")
    if not isinstance(devices, dict):
        return {}
    return {str(device): int(size) for device, size in sorted(devices.items()) if isinstance(size, int | float)}


def _problem(budget: dict) -> str:
    problem = budget.get("problem")
    return problem if isinstance(problem, str) else ""
