"""The read model of what the fleet serves: per host and model, the version serving now, the name each
model has on each host's runtime, and which reported rows a principal may read.

Everything here reads; ``serving_now`` is the one place that decides what a host serves, and placement,
rollouts, canaries, capture, the reconciler, the pages and version deletion all ask it.
"""

from deployments.choices import ACTIVE_TARGET_STATES, TargetState
from deployments.models import Deployment, DeploymentTarget, ServingHost
from modelyard.errors import Conflict, NotFound
from registry.access import visible_model_names
from registry.models import RegisteredModel


def serving_now(*, only: tuple[str, ...] = (), **filters) -> list[DeploymentTarget]:
    """What each host serves now, per the registry: for every (host, model), the target of the newest
    deployment that reached READY there. The one place that decides it.

    Args:
        only: load only these fields of the winners (``QuerySet.only`` paths such as ``"host__name"``;
            the host's name and the model's name are always loaded, for the order): for a caller that
            reads a few columns of many targets, whose JSON fields would otherwise all be decoded.
            Empty: whole rows.
        filters: narrow the READY targets considered (``host=``, ``host__in=``, ``deployment__model=`` …).

    Returns:
        One DeploymentTarget per (host, model), with its host, model and version loaded, ordered by
        host name, then model name. Two SQL queries: the fold reads three columns of every READY
        target (older targets stay READY when a newer deployment replaces them, so there are many),
        and only the winners are loaded whole.
    """
    latest: dict[tuple[int, int], int] = {}
    rows = (DeploymentTarget.objects.filter(state=TargetState.READY, **filters)
            .order_by("deployment__created_at", "deployment_id")
            .values_list("pk", "host_id", "deployment__model_id"))
    for pk, host_id, model_id in rows:  # oldest first: the newest deployment's target is written last
        latest[(host_id, model_id)] = pk
    if not latest:
        return []
    targets = (DeploymentTarget.objects.filter(pk__in=latest.values())
               .select_related("host", "deployment__model", "deployment__version"))
    if only:
        targets = targets.only("host__name", "deployment__model__name", *only)
    return sorted(targets, key=lambda t: (t.host.name, t.deployment.model.name))


def get_deployment(pk: int) -> Deployment:
    """Return deployment ``pk`` with its targets and hosts prefetched.

    Raises:
        NotFound: there is none.
    """
    try:
        return (
            Deployment.objects.select_related("model", "version")
            .prefetch_related("targets__host")
            .get(pk=pk)
        )
    except Deployment.DoesNotExist as exc:
        raise NotFound(f"no deployment {pk}") from exc


def host_served_name(host: ServingHost, model: RegisteredModel) -> str:
    """The name ``model`` has, or will have, on ``host``'s runtime.

    The name it was first deployed there under, kept across renames (so a renamed model's copies are
    still swapped and unloaded, and its clients keep their name); its registry name on a host that
    never served it.

    Raises:
        Conflict: another model holds that name on the host (it was renamed away and still serves
            there): unload that model there first.
    """
    kept = (DeploymentTarget.objects.filter(host=host, deployment__model=model).exclude(served_name="")
            .exclude(state=TargetState.CANCELLED).order_by("-deployment__created_at", "-id")
            .values_list("served_name", flat=True).first())
    name = kept or model.name
    holder = (DeploymentTarget.objects.filter(host=host, served_name=name)
              .exclude(deployment__model=model).filter(state__in=[*ACTIVE_TARGET_STATES, TargetState.READY])
              .select_related("deployment__model").first())
    if holder is not None:
        raise Conflict(f"{host.name} serves model {holder.deployment.model.name!r} under the name {name!r} "
                       f"(it was renamed since); unload it from {host.name} before deploying {model.name} there")
    return name


def served_owners(host_ids=None) -> dict[int, dict[str, str]]:
    """Which registry model each runtime name belongs to, per host: ``{host_id: {served name: model name}}``.

    One query for all hosts (or those in ``host_ids``). A name a host's report shows that is not in
    the map is the registry name of no renamed model, and stands for itself.
    """
    rows = DeploymentTarget.objects.exclude(served_name="")
    if host_ids is not None:
        rows = rows.filter(host_id__in=list(host_ids))
    owners: dict[int, dict[str, str]] = {}
    for host_id, served, model in rows.order_by("id").values_list("host_id", "served_name", "deployment__model__name"):
        owners.setdefault(host_id, {})[served] = model  # the newest target wins
    return owners


def hosts_keeping_version(version, **_) -> list[str]:
    """Why ``version`` (a ModelVersion) may not be deleted, as far as hosts go: ``["host(s) a, b serve it
    or are deploying it"]`` or ``[]``. A host serves it when the newest deployment that reached READY
    there for its model is of this version; a deployment of it still under way counts as well.
    Connected to ``registry.signals.version_deletion_check``."""
    hosts = [t.host.name for t in serving_now(deployment__model_id=version.model_id)
             if t.deployment.version_id == version.pk]
    hosts += sorted(
        DeploymentTarget.objects.filter(deployment__version=version, state__in=ACTIVE_TARGET_STATES)
        .exclude(host__name__in=hosts).values_list("host__name", flat=True).distinct()
    )
    return [f"host(s) {', '.join(hosts)} serve it or are deploying it"] if hosts else []


def hosts_lending_name(name: str, model_name: str) -> list[str]:
    """Names of the hosts on which runtime name ``name`` belongs to a model other than ``model_name``.

    Such a host serves a model that was renamed away from ``name`` (``host_served_name``), so its
    series labelled ``model="<name>"`` are that model's, not those of the model called ``name`` now.
    Sorted; empty when no renamed model kept the name anywhere.
    """
    lent = [host_id for host_id, names in served_owners().items() if names.get(name, model_name) != model_name]
    return sorted(ServingHost.objects.filter(pk__in=lent).values_list("name", flat=True))


def visible_report_rows(principal, host_id: int, rows: list[dict], owners: dict[int, dict[str, str]]) -> list[dict]:
    """The rows of a host's report (``{"name": runtime name, ...}``) about models ``principal`` may read.

    A row is judged by the model its runtime name belongs to on that host (``served_owners``), so a
    model renamed away keeps its copies to its own team, and a new model that took the old name does
    not see them.
    """

    names = visible_model_names(principal)
    if names is None:
        return list(rows)
    on_host = owners.get(host_id, {})
    return [row for row in rows if on_host.get(row.get("name"), row.get("name")) in names]
