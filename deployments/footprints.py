"""What a model version is known to hold in memory, for an on-demand deployment: the figure sent to each host's
loader with the deploy payload (``footprint_bytes``), and the check that refuses a version larger than a host's
on-demand memory budget before anything is written.

A version's figures come from three measurements: its performance card (``profiles.card_gpu_bytes``), the GPU
memory a deployment's load of it added (``DeploymentTarget.details["footprint_bytes"]["gpu"]``) and what a host's
on-demand loader measured when it loaded that version alone (the heartbeat's ``gateway.footprints``,
``modelyard_agent.footprints.version_footprints``). A footprint measured with another version loaded beside it (a
canary's two) is of both and counts for neither.
"""

from deployments.choices import Residency
from deployments.heartbeats import budget_bytes
from deployments.models import DeploymentTarget, ServingHost
from deployments.placement import measured_footprint
from deployments.routes import wanted_inference_keys
from deployments.targets import build_agent_payload
from modelyard.errors import Conflict
from registry.models import ModelVersion

# How many of the version's deployment targets are read for the footprints their hosts reported.
REPORTS_READ = 50


def reported_footprint(version: ModelVersion) -> int | None:
    """The most bytes ``version`` held on one device when a host's on-demand loader loaded it alone, over the hosts
    that were sent it (the last heartbeat of each, under the name it serves there), or None when none reported."""
    rows = (DeploymentTarget.objects.filter(deployment__version=version)
            .order_by("-updated_at").values_list("host__heartbeat", "served_name")[:REPORTS_READ])
    figures = []
    for heartbeat, served_name in rows:
        gateway = heartbeat.get("gateway") if isinstance(heartbeat, dict) else None
        footprints = gateway.get("footprints") if isinstance(gateway, dict) else None
        sizes = footprints.get(f"{served_name}/{version.version}") if isinstance(footprints, dict) else None
        if isinstance(sizes, dict):
            figures += [int(size) for size in sizes.values() if isinstance(size, int | float) and size > 0]
    return max(figures, default=None)


def version_footprint(version: ModelVersion) -> int | None:
    """The bytes ``version`` is known to hold on one device: the largest of what its performance card, the loads of
    its deployments and the hosts' on-demand loads measured (``placement.measured_footprint``,
    ``reported_footprint``); None when nothing measured it yet (each host's loader measures it at its first load).
    The largest, so that a host's budget never counts a version smaller than one measurement saw it."""
    figures = [figure for figure in (measured_footprint(version), reported_footprint(version)) if figure]
    return max(figures, default=None)


def deploy_payload(target: DeploymentTarget, *, download_url: str) -> dict:
    """``targets.build_agent_payload`` of ``target``, with ``inference_keys`` for a model that requires a key (the
    digests its host's front accepts, ``routes.wanted_inference_keys``: two queries), and ``footprint_bytes`` for an
    on-demand deployment: the version's known footprint (``version_footprint``), so the host's on-demand budget
    counts it before its first load there (None: the agent's loader measures it then)."""
    payload = build_agent_payload(target, download_url=download_url)
    if target.deployment.model.inference_key_required:
        # The keys go with the version, so its host's front checks them before the version serves there.
        payload["inference_keys"] = wanted_inference_keys(target.host).get(target.deployment.model.name, [])
    if target.deployment.residency == Residency.ON_DEMAND:
        payload["footprint_bytes"] = version_footprint(target.deployment.version)
    return payload


def check_budgets(version: ModelVersion, hosts: list[ServingHost]) -> int | None:
    """Refuse an on-demand deployment of ``version`` to a host whose on-demand memory budget (bytes per device, as
    its agent last reported it in a heartbeat) is smaller than the version's known footprint (``version_footprint``):
    its loader could never load it, and every request for it would wait and fail. Hosts that reported no budget
    are not checked. Reads only.

    Returns:
        The version's known footprint, bytes on one device (None: not measured yet).

    Raises:
        Conflict: a host's budget is smaller; the message names each such host, its budget and the footprint.
    """
    need = version_footprint(version)
    if need is None:
        return None
    small = [(host.name, budget) for host in hosts if (budget := budget_bytes(host)) is not None and need > budget]
    if small:
        raise Conflict(
            f"{version.model.name} v{version.version} needs {need} bytes of memory on one device, more than the "
            "on-demand memory budget of " + ", ".join(f"{name!r} ({budget} bytes per device)" for name, budget in small)
            + ": its loader could never load it. Raise the host's --memory-budget-bytes, or deploy it there with "
            "residency always")
    return need
