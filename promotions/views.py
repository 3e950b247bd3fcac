"""Promotion pages: the policies section of a model's page, a policy's history, and its form."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import F, Window
from django.db.models.functions import RowNumber
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from accounts.access import Action, Principal
from deployments.models import Replay
from deployments.replays import may_read_captured, replay_view
from modelyard.errors import DomainError
from modelyard.views import found_or_404
from promotions.evaluations import approve_evaluation, get_evaluation, reject_evaluation, request_evaluation
from promotions.forms import POLICY_FORM_FIELDS, PromotionPolicyForm
from promotions.models import PromotionEvaluation, PromotionPolicy
from promotions.policies import create_policy, get_policy, set_policy_enabled, update_policy
from registry.pages import model_or_404

RECENT_EVALUATIONS = 5
HISTORY_EVALUATIONS = 100


def policies_context(model) -> dict:
    """What the model page's policies section shows: each policy with its latest evaluations.

    Two queries whatever the number of policies: the policies, then their recent evaluations.

    Returns:
        ``{"policies": [PromotionPolicy with .recent (list of evaluations, newest first)]}``.
    """
    policies = list(PromotionPolicy.objects.filter(model=model).select_related("model").order_by("id"))
    recent: dict[int, list] = {p.pk: [] for p in policies}
    evaluations = (
        PromotionEvaluation.objects.filter(policy__model=model)
        .annotate(rank=Window(RowNumber(), partition_by=F("policy_id"), order_by=F("id").desc()))
        .filter(rank__lte=RECENT_EVALUATIONS)
        .select_related("candidate_version", "target_version", "decided_by", "policy__model").order_by("-id")
    )
    for evaluation in evaluations:
        recent[evaluation.policy_id].append(evaluation)
    for policy in policies:
        policy.recent = recent[policy.pk]
    return {"policies": policies}


@login_required
def model_policies(request, model_name: str):
    """The policies section alone, for the model page's htmx refresh."""
    model = model_or_404(request, model_name)
    return render(request, "promotions/partials/model_policies.html", {"model": model, **policies_context(model)})


@login_required
def policy_detail(request, policy_id: int):
    """A policy's settings and its last 100 evaluations with the metrics, checks and reasons."""
    policy = _policy_or_404(request, policy_id)
    evaluations = list(policy.evaluations.select_related("candidate_version", "target_version", "decided_by")
                       .order_by("-id")[:HISTORY_EVALUATIONS])
    _attach_replays(request, policy.model, evaluations)
    return render(request, "promotions/policy_detail.html", {"policy": policy, "evaluations": evaluations})


def _attach_replays(request, model, evaluations: list[PromotionEvaluation]) -> None:
    """Give each evaluation that judged or started a replay (``metrics["replay"]["id"]``) ``replay_shown``:
    ``{"replay": Replay, "view": deployments.replays.replay_view}``, with the worst disagreements for
    owners of the model's team only. One query for all of them."""
    ids = {(e.metrics or {}).get("replay", {}).get("id") for e in evaluations}
    ids = {i for i in ids if isinstance(i, int)}
    if not ids:
        return
    found = {r.pk: r for r in Replay.objects.filter(pk__in=ids, version__model=model)
             .select_related("version", "against", "host")}
    may_read = may_read_captured(Principal.of(request), model)
    for evaluation in evaluations:
        replay = found.get((evaluation.metrics or {}).get("replay", {}).get("id"))
        if replay is not None:
            evaluation.replay_shown = {"replay": replay, "view": replay_view(replay, may_read=may_read)}


def _policy_or_404(request, policy_id: int, action: Action = Action.VIEW) -> PromotionPolicy:
    """Policy ``policy_id`` once the user may do ``action`` on its model (404 if it cannot read the model)."""
    policy = found_or_404(get_policy, policy_id)
    model_or_404(request, policy.model.name, action)
    return policy


def _save(request, form, save) -> PromotionPolicy | None:
    if request.method != "POST" or not form.is_valid():
        return None
    try:
        return save({f: form.cleaned_data[f] for f in POLICY_FORM_FIELDS})
    except DomainError as exc:
        form.add_error(None, exc.message)
        return None


@login_required
def policy_create(request, model_name: str):
    """Create a policy for a model (owners of its team)."""
    model = model_or_404(request, model_name, Action.MANAGE_POLICY)
    form = PromotionPolicyForm(request.POST or None, initial={"candidate_alias": "staging",
                                                              "target_alias": "production"})
    policy = _save(request, form, lambda fields: create_policy(model_name=model.name, actor=request.user, **fields))
    if policy is not None:
        messages.success(request, f"Policy {policy.pk} created; it runs on '{policy.schedule}' (UTC).")
        return redirect("registry:model-detail", name=model.name)
    return render(request, "promotions/policy_form.html", {"model": model, "form": form, "policy": None})


@login_required
def policy_edit(request, policy_id: int):
    """Edit a policy (owners of its model's team); a new schedule takes effect without restarting beat."""
    policy = _policy_or_404(request, policy_id, Action.MANAGE_POLICY)
    form = PromotionPolicyForm(request.POST or None, instance=policy)
    saved = _save(request, form, lambda fields: update_policy(policy.pk, actor=request.user, **fields))
    if saved is not None:
        messages.success(request, f"Policy {saved.pk} saved.")
        return redirect("registry:model-detail", name=policy.model.name)
    return render(request, "promotions/policy_form.html", {"model": policy.model, "form": form, "policy": policy})


def _act(request, policy_id: int, act, done: str, action: Action = Action.MANAGE_POLICY):
    policy = _policy_or_404(request, policy_id, action)
    try:
        act(policy)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, done)
    return redirect("registry:model-detail", name=policy.model.name)


@login_required
@require_POST
def policy_run(request, policy_id: int):
    """Run now: queue an evaluation (maintainers of the model's team; the gates decide)."""
    return _act(request, policy_id, lambda p: request_evaluation(p.pk, actor=request.user),
                "Evaluation queued; its decision appears below within seconds.", Action.RUN_POLICY)


@login_required
@require_POST
def policy_pause(request, policy_id: int):
    """Pause a policy's schedule (owners of the model's team)."""
    return _act(request, policy_id, lambda p: set_policy_enabled(p.pk, False, actor=request.user),
                "Policy paused.")


@login_required
@require_POST
def policy_resume(request, policy_id: int):
    """Resume a policy's schedule (owners of the model's team)."""
    return _act(request, policy_id, lambda p: set_policy_enabled(p.pk, True, actor=request.user),
                "Policy resumed.")


def _decide(request, evaluation_id: int, decide, done: str):
    evaluation = found_or_404(get_evaluation, evaluation_id)
    model_or_404(request, evaluation.policy.model.name, Action.MANAGE_POLICY)
    try:
        decide(evaluation.pk)
    except DomainError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, done)
    return redirect("registry:model-detail", name=evaluation.policy.model.name)


@login_required
@require_POST
def evaluation_approve(request, evaluation_id: int):
    """Approve an evaluation awaiting approval: the target alias moves (owners of the model's team)."""
    return _decide(request, evaluation_id, lambda pk: approve_evaluation(pk, actor=request.user),
                   "Approved: the alias moved and rollouts following it start.")


@login_required
@require_POST
def evaluation_reject(request, evaluation_id: int):
    """Reject an evaluation awaiting approval (owners of the model's team)."""
    return _decide(request, evaluation_id,
                   lambda pk: reject_evaluation(pk, actor=request.user, reason=request.POST.get("reason", "")),
                   "Rejected: nothing moved.")
