"""Host heartbeats: store each agent's report on its host, stamped with when the runtime came back and
since when each model version has been loading or unloading.
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
