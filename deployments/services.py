"""Rollout planning: choose a version's hosts, check what the rollout would break, and write the
deployment with its targets; its rollout starts on commit (``deployments.rollouts``).

The web process only writes desired state and enqueues work on commit; the orchestrator task
``dispatch_target`` hands each host agent what it needs (``deployments.targets``).
"""

import math

from django.db import transaction

from audit.choices import AuditAction
from audit.services import acting_user, record_audit_event
from deployments.choices import RUNTIME_FORMATS, CanaryState, FailurePolicy, Residency, RolloutTrigger, TargetState
from deployments.enqueue import Job, job
from deployments.footprints import check_budgets
from deployments.hosts import check_labels
from deployments.models import Deployment, DeploymentTarget, ServingHost
from deployments.placement import choose_hosts
from deployments.profiles import card_instance_bounds, recommended_overrides
from deployments.served import host_served_name, serving_now
from modelyard.celery import require_broker
from modelyard.errors import Conflict, InvalidInput, NotFound
from modelyard_agent.contract import CANARY_PROTOCOL, KEYS_PROTOCOL, MAX_REQUEST_BYTES, MIN_REQUEST_BYTES, Runtime
from modelyard_agent.formats.triton_config import MAX_INSTANCE_COUNT, ModelConfigError, check_config_overrides
from registry.aliases import resolve_alias
from registry.choices import ArtifactFormat, VersionStatus
from registry.compare import breaking_changes
from registry.models import ModelVersion
from registry.versions import get_version


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


def check_percent(value, field: str = "canary_percent") -> float:
    """``value`` as a share of requests, in percent.

    Raises:
        InvalidInput: not a number from 0 to 100 (the message names ``field``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 <= value <= 100:
        raise InvalidInput(f"{field} must be a number from 0 to 100, got {value!r}")
    return float(value)


def check_canary_hosts(model_version, hosts: list[ServingHost]) -> None:
    """Refuse a canary of ``model_version`` on hosts that cannot split its model's traffic.

    Raises:
        Conflict: a host's agent never reported, reports a protocol older than ``CANARY_PROTOCOL`` or no
            live gateway (a BentoML agent older than the split reports none), serves no version of the model
            yet or already serves this one (there is nothing for the canary to share traffic with), or runs
            another active canary of the model (promote or roll that back first); the message names each such
            host and what to do.
    """

    model = model_version.model
    serving = {target.host_id: target.deployment.version_id
               for target in serving_now(host__in=hosts, deployment__model=model)}
    running = {target.host_id: target.deployment_id for target in DeploymentTarget.objects.filter(
        host__in=hosts, deployment__model=model, deployment__canary_state=CanaryState.ACTIVE)}
    problems = []
    for host in hosts:
        heartbeat = host.heartbeat or {}
        agent = heartbeat.get("agent") or {}
        if not agent:
            problems.append(f"{host.name}'s agent has never reported (start it"
                            + (" with --triton-url)" if host.runtime == Runtime.TRITON else ")"))
        elif int(agent.get("protocol") or 1) < CANARY_PROTOCOL:
            problems.append(f"{host.name}'s agent speaks protocol {agent.get('protocol') or 'unknown'}, canaries "
                            f"need {CANARY_PROTOCOL} (pip install -U ./modelyard_agent)")
        elif not (heartbeat.get("gateway") or {}).get("live"):
            problems.append(f"{host.name} reports no live gateway (run its agent with --triton-url and register "
                            f"the gateway's address as its inference_url)" if host.runtime == Runtime.TRITON else
                            f"{host.name} reports no live gateway (its agent's nginx needs Debian's "
                            f"libnginx-mod-http-lua and lua-cjson, and the agent pip install -U ./modelyard_agent)")
        elif host.pk not in serving:
            problems.append(f"{host.name} serves no version of {model.name} yet (roll one out first)")
        elif host.pk in running:
            problems.append(f"{host.name} runs the canary of rollout {running[host.pk]} (promote or roll it back "
                            "first)")
        elif serving[host.pk] == model_version.pk:
            problems.append(f"{host.name} serves v{model_version.version} already (a canary needs another version "
                            "to share traffic with)")
    if problems:
        raise Conflict("a canary cannot run here: " + "; ".join(problems))


def check_residency(residency: str, pinned, cold_start_timeout, hosts: list[ServingHost]) -> float | None:
    """Check a rollout's residency settings; returns the cold-start timeout in seconds (None: the default).

    Raises:
        InvalidInput: an unknown residency, a ``pinned`` that is not true or false, a timeout outside 0.1-600 s,
            or pinned or a timeout without ``on_demand``.
        Conflict: ``on_demand`` to a BentoML host: its front holds no requests while a ``bentoml serve``
            process starts (README, "Models on demand"), so every cold request would fail.
    """
    if residency not in Residency.values:
        raise InvalidInput(f"residency must be one of {', '.join(Residency.values)}, got {residency!r}")
    if not isinstance(pinned, bool):
        raise InvalidInput(f"pinned must be true or false, got {pinned!r}")
    if residency != Residency.ON_DEMAND:
        if pinned or cold_start_timeout is not None:
            raise InvalidInput('pinned and cold_start_timeout apply to residency "on_demand" only')
        return None
    if cold_start_timeout is not None:
        if isinstance(cold_start_timeout, bool) or not isinstance(cold_start_timeout, int | float) \
                or not 0.1 <= cold_start_timeout <= 600:
            raise InvalidInput(f"cold_start_timeout must be seconds from 0.1 to 600, got {cold_start_timeout!r}")
        cold_start_timeout = float(cold_start_timeout)
    bento = [host.name for host in hosts if host.runtime == Runtime.BENTOML]
    if bento:
        raise Conflict(f"residency on_demand needs Triton hosts with a gateway; {', '.join(bento)} run BentoML, "
                       "whose front cannot hold a request while a model starts: deploy there with residency always")
    return cold_start_timeout


def check_key_hosts(model, hosts: list[ServingHost]) -> None:
    """Refuse to deploy ``model``, which requires an inference key, to hosts whose agent reports a protocol older
    than ``KEYS_PROTOCOL``: their front would serve it to any client. Hosts that never reported pass (their agent
    sets the keys the deploy payload carries, or is refused by it).

    Raises:
        Conflict: naming each such host and what to do.
    """
    old = [f"{host.name} (protocol {protocol})" for host in hosts
           if (protocol := int(((host.heartbeat or {}).get("agent") or {}).get("protocol") or KEYS_PROTOCOL))
           < KEYS_PROTOCOL]
    if old:
        raise Conflict(f"{model.name} requires an inference key, which agents check from protocol {KEYS_PROTOCOL}: "
                       f"{', '.join(old)} would serve it to any client (pip install -U ./modelyard_agent there)")


def start_deployment(
    *, model_name: str, version: int | None = None, alias: str = "", host_names: list[str] | None = None,
    selector: dict | None = None, replicas: int | None = None, batch_size: int = 1,
    failure_policy: str = FailurePolicy.PAUSE, config_overrides: dict | None = None, autoscale: dict | None = None,
    actor=None, authorize=None, config: str = "", confirm_breaking: bool = False, canary_percent=None,
    shadow_percent=None, max_request_bytes: int | None = None, residency: str = Residency.ALWAYS,
    pinned: bool = False, cold_start_timeout: float | None = None,
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
        residency, pinned, cold_start_timeout: as ``create_rollout``.

    Returns:
        The new Deployment, RUNNING; its first batch is dispatched once the transaction commits.

    Raises:
        NotFound: the model, version or alias does not exist.
        InvalidInput: bad hosts/selector/overrides, or both or neither of version and alias.
        BreakingSignature: the version breaks the clients of a version it replaces, unconfirmed (a Conflict).
        Conflict: the version's format cannot be served by a chosen host's runtime, a canary's host cannot
            split traffic (``check_canary_hosts``), or a host's agent cannot check the inference keys the model
            requires (``check_key_hosts``).
        ServiceUnavailable: the task queue does not answer; nothing was written.
    """
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
    if model_version.model.inference_key_required:
        check_key_hosts(model_version.model, hosts)
    breaks = [] if confirm_breaking else signature_breaks(model_version, hosts)
    if breaks:
        raise BreakingSignature(f"v{model_version.version} breaks the signature of the version it replaces: "
                                f"{' · '.join(breaks)}. Confirm to roll it out anyway (confirm_breaking).")
    return create_rollout(
        model_version=model_version, hosts=hosts, batch_size=batch_size, failure_policy=failure_policy,
        config_overrides=config_overrides, follow_alias=alias, selector=selector or {}, autoscale=autoscale,
        actor=actor, canary_percent=canary_percent, shadow_percent=shadow_percent,
        max_request_bytes=max_request_bytes, residency=residency, pinned=pinned, cold_start_timeout=cold_start_timeout,
    )


def create_rollout(
    *, model_version: ModelVersion, hosts: list[ServingHost], batch_size: int = 1,
    failure_policy: str = FailurePolicy.PAUSE, config_overrides: dict | None = None, follow_alias: str = "",
    selector: dict | None = None, rollback_of: Deployment | None = None,
    prerequisite_for: Deployment | None = None, autoscale: dict | None = None,
    trigger: str = RolloutTrigger.OPERATOR, reason: str = "", actor=None, canary_percent: float | None = None,
    shadow_percent: float | None = None, max_request_bytes: int | None = None, residency: str = Residency.ALWAYS,
    pinned: bool = False, cold_start_timeout: float | None = None,
) -> Deployment:
    """Write a deployment and its targets in batches, then (on commit) start its rollout.

    For a Triton ensemble, every composing model version that a chosen host does not serve yet
    gets a rollout of its own to those hosts first (``prerequisite_for``); the ensemble's hosts
    move only once those succeed.

    Each target records the version its host serves now (``previous_version``), which a
    rollback returns it to. Hosts keep the given order; batch ``i`` holds hosts
    ``i*batch_size .. (i+1)*batch_size-1``.

    ``residency`` "on_demand" registers the model on each host without keeping it loaded
    (``check_residency``); ``pinned`` keeps it once loaded, ``cold_start_timeout`` (seconds) bounds how long
    a request waits for its load.

    Raises:
        InvalidInput: no hosts, a batch size below 1, an unknown policy or residency, or bad overrides.
        Conflict: a host's runtime cannot serve the version's format, or the version is CORRUPT, or an
            on-demand model goes to a host that cannot hold requests (``check_residency``), or to a host whose
            on-demand memory budget is smaller than the version's known footprint (``footprints.check_budgets``).
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
    cold_start_timeout = check_residency(residency, pinned, cold_start_timeout, hosts)
    if residency == Residency.ON_DEMAND:
        check_budgets(model_version, hosts)
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
            max_request_bytes=max_request_bytes, residency=residency, pinned=bool(pinned),
            cold_start_timeout=cold_start_timeout,
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


def end_canaries_replaced(model_version, hosts: list[ServingHost], *, by: Deployment) -> list[int]:
    """Record that a plain rollout ``by`` of ``model_version`` to ``hosts`` ends the active canaries of its
    model that run on no other host: each agent routes every request to the version it deploys and drops
    the route, so such a canary is promoted (the same version) or rolled back (another one). Audited.

    Returns:
        The ids of the canary deployments ended.
    """
    ids = {host.pk for host in hosts}
    ended = []
    canaries = (Deployment.objects.filter(model=model_version.model, canary_state=CanaryState.ACTIVE)
                .exclude(pk=by.pk).prefetch_related("targets"))
    for canary in canaries:
        on = {t.host_id for t in canary.targets.all() if t.state == TargetState.READY}
        if not on or not on <= ids:
            continue
        state = CanaryState.PROMOTED if canary.version_id == model_version.pk else CanaryState.ROLLED_BACK
        Deployment.objects.filter(pk=canary.pk).update(canary_state=state)
        record_audit_event(
            action=AuditAction.DEPLOYMENT_CHANGED, actor=None, obj_type="deployment", obj_id=canary.pk,
            model=canary.model, data={"change": f"canary_{state}", "version": canary.version.version,
                                      "by_rollout": by.pk, "to_version": model_version.version})
        ended.append(canary.pk)
    return ended


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
