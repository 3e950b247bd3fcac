"""Fleet operations: start deployments, record host progress (serving hosts themselves: ``deployments.hosts``).

The web process only writes desired state and enqueues work on commit; the
orchestrator task ``dispatch_target`` hands each host agent what it needs, and
the agent's reports come back through ``record_target_progress``.
"""

import logging

from django.db import transaction
from django.utils import timezone

from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from deployments.choices import (
    ACTIVE_TARGET_STATES,
    RUNTIME_FORMATS,
    TARGET_MACHINE,
    CanaryState,
    FailurePolicy,
    RolloutTrigger,
    TargetState,
)
from deployments.enqueue import Job, job
from deployments.hosts import check_labels
from deployments.models import Deployment, DeploymentTarget, ServingHost, TargetEvent
from deployments.placement import choose_hosts
from deployments.profiles import card_instance_bounds, recommended_overrides
from modelyard.celery import require_broker
from modelyard.errors import Conflict, InvalidInput, NotFound
from modelyard.states import IllegalTransition
from modelyard_agent.claims import claim_key
from modelyard_agent.contract import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES
from modelyard_agent.formats.triton_config import MAX_INSTANCE_COUNT, ModelConfigError, check_config_overrides
from registry.access import visible_model_names
from registry.choices import ArtifactFormat, VersionStatus
from registry.compare import breaking_changes
from registry.formats import archive_limits
from registry.models import ModelVersion, RegisteredModel
from registry.services import get_version, resolve_alias

logger = logging.getLogger(__name__)


class BreakingSignature(Conflict):
    """A rollout would replace, on some host, a version whose clients the new version's signature breaks;
    it starts only when confirmed (HTTP 409 until then)."""

    code = "breaking_signature"  # a client may repeat the request with confirm_breaking


def signature_breaks(model_version: ModelVersion, hosts: list[ServingHost]) -> list[str]:
    """What breaks for the clients of each version ``model_version`` would replace on ``hosts``.

    Returns:
        One sentence per replaced version with breaking changes ("v3 on gpu-0, gpu-1: input x: removed…"),
        empty when every replaced version's clients keep working (or nothing is replaced).
    """
    replaced: dict[int, tuple[ModelVersion, list[str]]] = {}
    for target in serving_now(host__in=hosts, deployment__model=model_version.model):
        old = target.deployment.version
        if old.pk != model_version.pk:
            replaced.setdefault(old.pk, (old, []))[1].append(target.host.name)
    sentences = []
    for old, names in sorted(replaced.values(), key=lambda item: item[0].version):
        changes = breaking_changes(old, model_version)
        if changes:
            sentences.append(f"v{old.version} on {', '.join(sorted(names))}: {'; '.join(changes)}")
    return sentences


def start_deployment(
    *, model_name: str, version: int | None = None, alias: str = "", host_names: list[str] | None = None,
    selector: dict | None = None, replicas: int | None = None, batch_size: int = 1,
    failure_policy: str = FailurePolicy.PAUSE, config_overrides: dict | None = None, autoscale: dict | None = None,
    actor=None, authorize=None, config: str = "", confirm_breaking: bool = False, canary_percent=None,
    shadow_percent=None, max_request_bytes: int | None = None,
) -> Deployment:
    """Roll one model version out to a set of hosts, ``batch_size`` hosts at a time.

    Args:
        model_name: registered model name.
        version: the version to pin; or
        alias: an alias to follow instead: its version now, and a new rollout to the same hosts
            each time the alias moves.
        host_names: the hosts, by name (no repeats); or
        selector: ``{label: value}`` the hosts' labels must all match; with ``replicas`` the
            online matching hosts with the most free GPU memory are chosen (see
            ``deployments.placement``).
        batch_size: hosts moved at once (max unavailable), 1 or more.
        failure_policy: a ``FailurePolicy`` value.
        config_overrides: a partial Triton model config (instance_group, dynamic_batching,
            max_batch_size) applied at load on every host.
        autoscale: bounds for the autoscaler (see ``check_autoscale``); None or {} for none.
        config: ``"recommended"``: serve with the config the version's performance card recommends
            (``deployments.profiles.recommended_overrides``), instead of ``config_overrides``.
        max_request_bytes: the most bytes an infer request body may hold at each host's gateway (1024 or
            more, capped there by the host's ``--max-request-bytes``); None: derived from the version's
            signature (``modelyard_agent.formats.request_limits``).
        actor: the requesting user.
        authorize: ``authorize(model_version, hosts)``, called once the hosts are chosen and before
            anything is written; it raises (e.g. ``Forbidden``) to refuse the rollout. The API and
            pages pass the access check of ``accounts.access`` (production hosts need an owner).
        confirm_breaking: start even though the version breaks the signature of a version it replaces
            on a chosen host (see :func:`signature_breaks`).
        canary_percent: 0-100: a canary (``deployments.canaries``): each host keeps the version it
            serves and sends this share of the requests that name no version to the new one.
        shadow_percent: 0-100: also mirror this share of them to the new one (its answers discarded); without
            ``canary_percent`` the canary percent is 0 (a shadow deployment).

    Returns:
        The new Deployment, RUNNING; its first batch is dispatched once the transaction commits.

    Raises:
        NotFound: the model, version or alias does not exist.
        InvalidInput: bad hosts/selector/overrides, or both or neither of version and alias.
        BreakingSignature: the version breaks the clients of a version it replaces, unconfirmed (a Conflict).
        Conflict: the version's format cannot be served by a chosen host's runtime, or a canary's
            host cannot split traffic (``canaries.check_canary_hosts``).
        ServiceUnavailable: the task queue does not answer; nothing was written.
    """
    from deployments.canaries import check_canary_hosts, check_percent

    if shadow_percent is not None:
        shadow_percent = check_percent(shadow_percent, "shadow_percent")
        canary_percent = 0.0 if canary_percent is None else canary_percent
    if canary_percent is not None:
        canary_percent = check_percent(canary_percent)

    if version is None and not alias:
        raise InvalidInput("give a version to pin or an alias to follow")
    if version is not None and alias:
        raise InvalidInput("give either a version or an alias to follow, not both")
    model_version = resolve_alias(model_name, alias) if alias else get_version(model_name, version)
    if config:

        if config != "recommended":
            raise InvalidInput(f'config must be "recommended" (the performance card\'s), got {config!r}')
        if config_overrides:
            raise InvalidInput('give either config_overrides or "config": "recommended", not both')
        config_overrides = recommended_overrides(model_version)
    if host_names and selector:
        raise InvalidInput("choose hosts by name or by selector, not both")
    if host_names:
        if len(set(host_names)) != len(host_names):
            raise InvalidInput("hosts must not repeat a host")
        found = {h.name: h for h in ServingHost.objects.filter(name__in=host_names)}
        unknown = [name for name in host_names if name not in found]
        if unknown:
            raise InvalidInput(f"unknown serving host(s): {', '.join(map(repr, unknown))}")
        hosts = [found[n] for n in host_names]
    elif selector:
        hosts = choose_hosts(model_version, check_labels(selector, "selector"), replicas=replicas)
    else:
        raise InvalidInput("hosts must name at least one serving host, or give a selector")
    if authorize is not None:
        authorize(model_version, hosts)
    if canary_percent is not None:
        check_canary_hosts(model_version, hosts)
    breaks = [] if confirm_breaking else signature_breaks(model_version, hosts)
    if breaks:
        raise BreakingSignature(f"v{model_version.version} breaks the signature of the version it replaces: "
                                f"{' · '.join(breaks)}. Confirm to roll it out anyway (confirm_breaking).")
    return create_rollout(
        model_version=model_version, hosts=hosts, batch_size=batch_size, failure_policy=failure_policy,
        config_overrides=config_overrides, follow_alias=alias, selector=selector or {}, autoscale=autoscale,
        actor=actor, canary_percent=canary_percent, shadow_percent=shadow_percent,
        max_request_bytes=max_request_bytes,
    )


def create_rollout(
    *, model_version: ModelVersion, hosts: list[ServingHost], batch_size: int = 1,
    failure_policy: str = FailurePolicy.PAUSE, config_overrides: dict | None = None, follow_alias: str = "",
    selector: dict | None = None, rollback_of: Deployment | None = None,
    prerequisite_for: Deployment | None = None, autoscale: dict | None = None,
    trigger: str = RolloutTrigger.OPERATOR, reason: str = "", actor=None, canary_percent: float | None = None,
    shadow_percent: float | None = None, max_request_bytes: int | None = None,
) -> Deployment:
    """Write a deployment and its targets in batches, then (on commit) start its rollout.

    For a Triton ensemble, every composing model version that a chosen host does not serve yet
    gets a rollout of its own to those hosts first (``prerequisite_for``); the ensemble's hosts
    move only once those succeed.

    Each target records the version its host serves now (``previous_version``), which a
    rollback returns it to. Hosts keep the given order; batch ``i`` holds hosts
    ``i*batch_size .. (i+1)*batch_size-1``.

    Raises:
        InvalidInput: no hosts, a batch size below 1, an unknown policy, or bad overrides.
        Conflict: a host's runtime cannot serve the version's format, or the version is CORRUPT.
        ServiceUnavailable: the task queue does not answer (``modelyard.celery.require_broker``); nothing written.
    """

    if not hosts:
        raise InvalidInput("a deployment needs at least one serving host")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a whole number of hosts, 1 or more, got {batch_size!r}")
    if failure_policy not in FailurePolicy.values:
        raise InvalidInput(f"failure_policy must be one of {', '.join(FailurePolicy.values)}")
    try:
        overrides = check_config_overrides(config_overrides)
    except ModelConfigError as exc:
        raise InvalidInput(str(exc)) from exc
    limits = check_autoscale(autoscale, version=model_version)
    if max_request_bytes is not None and (isinstance(max_request_bytes, bool) or not isinstance(
            max_request_bytes, int) or not MIN_REQUEST_BYTES <= max_request_bytes <= MAX_REQUEST_BYTES):
        raise InvalidInput(f"max_request_bytes must be a whole number of bytes from {MIN_REQUEST_BYTES} to "
                           f"{MAX_REQUEST_BYTES}, got {max_request_bytes!r}")
    for host in hosts:
        if model_version.format not in RUNTIME_FORMATS.get(host.runtime, frozenset()):
            raise Conflict(
                f"{model_version.model.name} v{model_version.version} is a {model_version.get_format_display()}, "
                f"which {host.name!r} ({host.get_runtime_display()}) cannot serve"
            )
    serving = {t.host_id: t.deployment.version for t in serving_now(host__in=hosts,
                                                                     deployment__model=model_version.model)}
    served_names = {host.pk: host_served_name(host, model_version.model) for host in hosts}
    require_broker("the deployment")
    with transaction.atomic():
        # delete_version locks the same row: a version deleted since get_version is not deployed.
        status = ModelVersion.objects.select_for_update().filter(pk=model_version.pk).values_list(
            "status", flat=True).first()
        if status in (None, VersionStatus.DELETED):
            raise NotFound(f"model {model_version.model.name!r} has no version {model_version.version}")
        if status == VersionStatus.CORRUPT:
            raise Conflict(f"{model_version.model.name} v{model_version.version} is corrupt (its stored bytes do "
                           "not match its sha256) and cannot be deployed; register it again")
        deployment = Deployment.objects.create(
            model=model_version.model, version=model_version, created_by=acting_user(actor), batch_size=batch_size,
            failure_policy=failure_policy, follow_alias=follow_alias, selector=selector or {},
            config_overrides=overrides, rollback_of=rollback_of, prerequisite_for=prerequisite_for,
            autoscale=limits, trigger=trigger, canary_percent=canary_percent, shadow_percent=shadow_percent,
            canary_state=CanaryState.ACTIVE if canary_percent is not None else "",
            max_request_bytes=max_request_bytes,
        )
        DeploymentTarget.objects.bulk_create(
            DeploymentTarget(deployment=deployment, host=host, batch=i // batch_size,
                             previous_version=serving.get(host.pk), served_name=served_names[host.pk])
            for i, host in enumerate(hosts)
        )
        record_audit_event(
            action=AuditAction.DEPLOYMENT_CREATED, actor=actor, obj_type="deployment", obj_id=deployment.pk,
            model=model_version.model,
            data={"version": model_version.version, "hosts": [h.name for h in hosts], "batch_size": batch_size,
                  "follow_alias": follow_alias, "rollback_of": rollback_of.pk if rollback_of else None,
                  "trigger": trigger, **({"reason": reason} if reason else {}),
                  **({"canary_percent": canary_percent} if canary_percent is not None else {}),
                  **({"shadow_percent": shadow_percent} if shadow_percent is not None else {})},
        )
        if model_version.format == ArtifactFormat.TRITON_ENSEMBLE:
            _deploy_composing_models(deployment, hosts, actor=actor)
        if canary_percent is None:
            from deployments.canaries import end_canaries_replaced

            end_canaries_replaced(model_version, hosts, by=deployment)
        # Robust: should the queue stop answering after the check above, the deployment stays RUNNING and the
        # reconciler's next pass (advance_running_rollouts) takes its first step instead.
        transaction.on_commit(lambda: job(Job.ADVANCE_ROLLOUT, deployment.pk), robust=True)
    return deployment


def _deploy_composing_models(ensemble: Deployment, hosts: list[ServingHost], *, actor) -> None:
    """Start a prerequisite rollout for each composing model version some of ``hosts`` lack."""
    served = {(t.host_id, t.deployment.model_id): t.deployment.version_id for t in serving_now(host__in=hosts)}
    for link in ensemble.version.members.select_related("member__model"):
        member = link.member
        missing = [
            h for h in hosts
            if not ((h.pk, member.model_id) in served
                    and (link.requested_version == -1 or served[(h.pk, member.model_id)] == member.pk))
        ]
        if missing:
            create_rollout(model_version=member, hosts=missing, batch_size=ensemble.batch_size,
                           failure_policy=FailurePolicy.PAUSE, prerequisite_for=ensemble,
                           trigger=RolloutTrigger.PREREQUISITE, actor=actor)


AUTOSCALE_KEYS = ("min_instances", "max_instances", "queue_ms_high", "queue_ms_low")


def check_autoscale(autoscale: dict | None, *, version: ModelVersion | None = None) -> dict:
    """Check a deployment's autoscale bounds.

    Args:
        autoscale: ``{"min_instances": int ≥ 1, "max_instances": int ≤ 64, "queue_ms_high": ms,
            "queue_ms_low": ms}`` (instances per host; the autoscaler adds one when the mean queue
            time passes ``queue_ms_high`` and removes one below ``queue_ms_low``); None or {}: off.
            Without both instance bounds, they default from ``version``'s performance card
            (``deployments.profiles.card_instance_bounds``).
        version: the version deployed, whose card gives default instance bounds.

    Returns:
        The bounds, or {}.

    Raises:
        InvalidInput: a missing or unknown key, or bounds that do not make sense.
    """

    if not autoscale:
        return {}
    bounds = ("min_instances", "max_instances")
    if isinstance(autoscale, dict) and version is not None and not set(bounds) & set(autoscale):

        if (card := card_instance_bounds(version)) is None:
            raise InvalidInput(f"autoscale needs min_instances and max_instances: {version} has no performance card "
                               "with a recommendation to default them from")
        autoscale = {**autoscale, **dict(zip(bounds, card, strict=True))}
    if not isinstance(autoscale, dict) or set(autoscale) != set(AUTOSCALE_KEYS):
        raise InvalidInput(f"autoscale must be a JSON object with exactly {', '.join(AUTOSCALE_KEYS)}")
    low, high = autoscale["min_instances"], autoscale["max_instances"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) or not (
        1 <= low <= high <= MAX_INSTANCE_COUNT
    ):
        raise InvalidInput(f"autoscale needs 1 ≤ min_instances ≤ max_instances ≤ {MAX_INSTANCE_COUNT}")
    q_high, q_low = autoscale["queue_ms_high"], autoscale["queue_ms_low"]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (q_high, q_low)) or not (
        0 <= q_low < q_high
    ):
        raise InvalidInput("autoscale needs 0 ≤ queue_ms_low < queue_ms_high (milliseconds)")
    return {"min_instances": low, "max_instances": high, "queue_ms_high": q_high, "queue_ms_low": q_low}


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


def transition(target_id: int, to_state: str, *, message: str = "", details: dict | None = None) -> bool:
    """Move a deployment target to ``to_state`` with a compare-and-set update.

    Args:
        target_id: the DeploymentTarget's primary key.
        to_state: a ``TargetState`` value.
        message: the error (for FAILED) or a note, kept on the event row.
        details: merged into the target's ``details``.

    Returns:
        True when the state changed, False when the target was already in
        ``to_state`` (a repeat is a no-op).

    Raises:
        IllegalTransition: the move is not in ``TARGET_TRANSITIONS`` (for
            example a late progress report for a finished target); a ``Conflict``.
        NotFound: no such target.
    """
    with transaction.atomic():
        try:
            target = DeploymentTarget.objects.select_for_update().get(pk=target_id)
        except DeploymentTarget.DoesNotExist as exc:
            raise NotFound(f"no deployment target {target_id}") from exc
        before = target.state
        changed = TARGET_MACHINE.move(
            target, to_state, refusal=f"target {target_id}: {before} -> {to_state} is not allowed",
            error=message if to_state == TargetState.FAILED else target.error,
            details={**target.details, **(details or {})}, updated_at=timezone.now(),
        )
        if changed:
            TargetEvent.objects.create(target=target, from_state=before, to_state=to_state, message=message)
        return changed


def record_target_progress(target_id: int, state: str, *, message: str = "", details: dict | None = None) -> None:
    """Record a host agent's report for a target; stale or repeated reports are ignored.

    Args:
        target_id: the DeploymentTarget's primary key.
        state: the ``TargetState`` the agent reached.
        message: Triton's or the agent's error text for FAILED.
        details: what the agent measured (durations in seconds, replaced versions).
    """
    try:
        transition(target_id, state, message=message, details=details)
    except IllegalTransition as exc:
        logger.info("ignoring stale progress report: %s", exc)


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


def build_agent_payload(target: DeploymentTarget, *, download_url: str) -> dict:
    """Return the JSON payload a host agent needs to carry out one target.

    The agent gets no database or S3 credentials: it receives a presigned
    download URL, the artifact's sha256 and size (bytes), the uploaded
    config.pbtxt text (bento.yaml or model.yaml for BentoML archives) and the host's config
    overrides. ``runtime`` tells the agent which runtime adapter carries the target out;
    ``load_deadline`` and ``unload_deadline`` (seconds) bound each load and unload there;
    ``claim`` names the key the agent and a cancel race for (``modelyard_agent.claims``);
    ``archive_limits`` are the registry's own, which the agent checks again before it unpacks.
    The shape is ``modelyard_agent.contract.DeployPayload``; ``deployments.enqueue.send_to_host``
    stamps the protocol on it.
    """

    version: ModelVersion = target.deployment.version
    return {
        "target_id": target.pk,
        "claim": claim_key(target.pk, target.dispatched_at) if target.dispatched_at else str(target.pk),
        "host": target.host.name,
        "runtime": target.host.runtime,
        "format": version.format,
        "model": target.runtime_name,
        "version": version.version,
        "artifact_url": download_url,
        "sha256": version.artifact_sha256,
        "size": version.artifact_size,
        "config_text": version.config_text,
        "parameters": dict(target.host.config_overrides.get("parameters", {})),
        "config_overrides": dict(target.deployment.config_overrides),
        "sample_input": (version.metadata or {}).get("sample_input"),
        "signature": version.signature,
        "inference_url": target.host.inference_url,
        "metrics_url": target.host.metrics_url,
        "load_deadline": target.host.load_deadline_seconds,
        "unload_deadline": target.host.unload_deadline_seconds,
        "archive_limits": archive_limits().as_payload(),
        "canary_percent": (target.deployment.canary_percent
                           if target.deployment.canary_state == CanaryState.ACTIVE else None),
        "shadow_percent": (target.deployment.shadow_percent
                           if target.deployment.canary_state == CanaryState.ACTIVE else None),
        "max_request_bytes": target.deployment.max_request_bytes,
    }


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
