"""What serves where, at a glance: the model list's serving column, the model page's serving panel
and the host table of the rollout form.

Everything here reads; what a host serves is decided by ``deployments.served.serving_now`` alone.
"""

from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from deployments.canaries import canary_summary
from deployments.choices import (
    ACTIVE_DEPLOYMENT_STATUSES,
    ACTIVE_TARGET_STATES,
    RUNTIME_FORMATS,
    CanaryState,
    TargetState,
)
from deployments.models import Deployment, ServingHost
from deployments.served import serving_now
from registry.choices import VersionStatus
from registry.models import ModelVersion


def serving_by_model(models, **_) -> dict[int, list[dict]]:
    """The versions each of ``models`` serves now, and where.

    Connected to ``registry.signals.serving_lookup`` (the models list asks it for its page).

    Args:
        models: RegisteredModel rows (a page of the list).

    Returns:
        ``{model pk: [{"version": number, "hosts": [host names, sorted]}]}``, newest version first;
        a model that serves nowhere is left out. Two SQL queries however many models and hosts.
    """
    by_model: dict[int, dict[int, list[str]]] = {}
    for target in serving_now(deployment__model__in=[m.pk for m in models]):
        versions = by_model.setdefault(target.deployment.model_id, {})
        versions.setdefault(target.deployment.version.version, []).append(target.host.name)
    return {pk: [{"version": v, "hosts": sorted(hosts)} for v, hosts in sorted(versions.items(), reverse=True)]
            for pk, versions in by_model.items()}


@dataclass
class HostRow:
    """One host on the model page's serving panel.

    ``serving``: the version (ModelVersion) it serves of the model, or None; ``aliases``: the names of
    the model's aliases that point at that version; ``rollout``: the active rollout moving this host
    (a Deployment, or None) and ``step`` the host's state in it (a ``TargetState`` value), ``batch``
    its batch (0-based), ``canary`` whether that batch is the rollout's canary batch; ``traffic``: the
    active traffic canary on this host (``canaries.canary_summary``'s host entry with ``deployment``,
    ``version``, ``percent`` and ``shadow_percent``), or None.
    """

    host: ServingHost
    serving: ModelVersion | None = None
    aliases: list[str] = field(default_factory=list)
    rollout: Deployment | None = None
    step: str = ""
    step_label: str = ""  # the step as the rollout page names it
    batch: int = 0
    canary: bool = False
    traffic: dict | None = None


@dataclass
class RolloutSummary:
    """An active rollout of the model as the serving panel shows it.

    ``batches``: how many batches it moves its hosts in; ``canary``: the host names of its first batch
    when there is more than one batch (the hosts that take the new version before the rest), else
    empty; ``canary_done``: whether every canary host is READY; ``moved`` / ``total``: hosts READY /
    all its hosts. ``traffic_percent``: for a traffic canary (``canary_percent``), the share of the
    requests naming no version its gateways send to the new version; None for a rollout without one.
    """

    deployment: Deployment
    batches: int
    canary: list[str]
    canary_done: bool
    moved: int
    total: int
    traffic_percent: float | None = None


def model_serving(model) -> dict:
    """The model page's serving panel: each host that serves ``model`` or takes part in an active
    rollout of it, with its version, the aliases on that version and its rollout step; and the
    model's active rollouts with their canary batch.

    Args:
        model: a RegisteredModel.

    Returns:
        ``{"hosts": [HostRow] by host name, "rollouts": [RolloutSummary] oldest first, "canaries":
        [canaries.canary_summary of each active traffic canary, with its ``deployment``]}``. Ten SQL
        queries however many hosts, versions and rollouts: the aliases, ``serving_now`` (two), the
        active rollouts with their targets and those targets' hosts, and the active traffic canaries
        with their targets, hosts and stable versions.
    """

    aliases: dict[int, list[str]] = {}
    for name, version_id in model.aliases.order_by("name").values_list("name", "version_id"):
        aliases.setdefault(version_id, []).append(name)
    rows: dict[str, HostRow] = {}
    for target in serving_now(deployment__model=model):
        version = target.deployment.version
        rows[target.host.name] = HostRow(host=target.host, serving=version, aliases=aliases.get(version.pk, []))
    active = list(Deployment.objects.filter(model=model, status__in=ACTIVE_DEPLOYMENT_STATUSES)
                  .select_related("version").prefetch_related("targets__host").order_by("created_at", "id"))
    summaries = []
    for deployment in active:
        targets = sorted(deployment.targets.all(), key=lambda t: (t.batch, t.host.name))
        batches = max((t.batch for t in targets), default=0) + 1
        canary = [t for t in targets if t.batch == 0] if batches > 1 else []
        summaries.append(RolloutSummary(
            deployment=deployment, batches=batches, canary=[t.host.name for t in canary],
            canary_done=bool(canary) and all(t.state == TargetState.READY for t in canary),
            moved=sum(t.state == TargetState.READY for t in targets), total=len(targets),
            traffic_percent=deployment.canary_percent if deployment.canary_state == CanaryState.ACTIVE else None))
        for target in targets:
            if target.state not in ACTIVE_TARGET_STATES:
                continue  # a host already moved or given up shows what it serves
            row = rows.setdefault(target.host.name, HostRow(host=target.host))
            row.rollout, row.step, row.step_label = deployment, target.state, target.get_state_display()
            row.batch, row.canary = target.batch, bool(canary) and target.batch == 0
    traffic = []
    for deployment in (Deployment.objects.filter(model=model, canary_state=CanaryState.ACTIVE)
                       .select_related("version", "model")
                       .prefetch_related("targets__host", "targets__previous_version").order_by("created_at", "id")):
        summary = {**canary_summary(deployment), "deployment": deployment}
        traffic.append(summary)
        for host in summary["hosts"]:
            if host["host"] in rows:
                rows[host["host"]].traffic = {**host, "deployment": deployment, "version": summary["version"],
                                              "percent": summary["percent"],
                                              "shadow_percent": summary["shadow_percent"]}
    return {"hosts": [rows[name] for name in sorted(rows)], "rollouts": summaries, "canaries": traffic}


def unreachable_warning(host: ServingHost, *, now=None) -> str:
    """Why a rollout to ``host`` may not get anywhere, and when its part fails, or "" when it is online.

    A target on a host whose agent never reported fails after ``UNREPORTED_HOST_TIMEOUT`` seconds,
    on an offline host after ``DISPATCH_TIMEOUT`` (``deployments.reconcile.fail_stalled_targets``).
    """
    now = now or timezone.now()
    if host.is_online(now=now):
        return ""
    if host.last_heartbeat_at is None:
        return (f"{host.name}: its agent never reported (nothing consumes Celery queue {host.queue}); its part "
                f"fails after {settings.UNREPORTED_HOST_TIMEOUT:g} s unless the agent starts by then.")
    age = int((now - host.last_heartbeat_at).total_seconds())
    state = "its runtime was not live at its last report" if not host.heartbeat.get("runtime_live") else (
        f"no report for {age} s")
    return (f"{host.name}: offline ({state}, {host.last_heartbeat_at:%Y-%m-%d %H:%M:%S} UTC); its part fails "
            f"after {settings.DISPATCH_TIMEOUT:g} s unless it comes back.")


def rollout_host_rows(model) -> list[dict]:
    """The hosts the rollout form offers, with what helps to choose among them.

    Args:
        model: the RegisteredModel being rolled out.

    Returns:
        One dict per serving host whose runtime can serve a format of the model's versions (every host
        while it has none), by name: ``host`` (ServingHost), ``online`` (bool), ``serving`` (the version
        number of ``model`` it serves, or None) and ``warning`` (``unreachable_warning``, "" for an online
        host). Four SQL queries however many hosts.
    """
    now = timezone.now()
    serving = {t.host_id: t.deployment.version.version for t in serving_now(deployment__model=model)}
    formats = set(model.versions.exclude(status=VersionStatus.DELETED).values_list("format", flat=True))
    hosts = ServingHost.objects.order_by("name")
    if formats:
        hosts = hosts.filter(runtime__in=[runtime for runtime, served in RUNTIME_FORMATS.items() if served & formats])
    return [{"host": host, "online": host.is_online(now=now), "serving": serving.get(host.pk),
             "warning": unreachable_warning(host, now=now)} for host in hosts]
