"""Promotions API: policies (run now, pause, resume), evaluations (approve, reject) and webhooks."""

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.access import Action, Principal, can_see, require, scope_team_filter
from accounts.choices import Role
from accounts.models import Team
from modelyard.api import error_responses
from modelyard.errors import Forbidden, InvalidInput
from promotions import webhooks
from promotions.api.filters import PromotionEvaluationFilter, PromotionPolicyFilter
from promotions.api.serializers import (
    PromotionEvaluationSerializer,
    PromotionPolicySerializer,
    PromotionPolicyWriteSerializer,
    RejectSerializer,
    WebhookCreatedSerializer,
    WebhookDeliverySerializer,
    WebhookSerializer,
)
from promotions.evaluations import approve_evaluation, reject_evaluation, request_evaluation
from promotions.models import PromotionEvaluation, PromotionPolicy, Webhook
from promotions.policies import create_policy, delete_policy, set_policy_enabled, update_policy
from registry.access import model_for

EVALUATIONS = PromotionEvaluation.objects.select_related(
    "policy__model", "candidate_version", "target_version", "requested_by", "decided_by")


def _evaluation_data(pk: int) -> dict:
    return PromotionEvaluationSerializer(EVALUATIONS.get(pk=pk)).data


class PromotionPolicyViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, mixins.UpdateModelMixin,
    mixins.DestroyModelMixin, viewsets.GenericViewSet,
):
    """Promotion policies: move a target alias to a candidate alias's version when its metrics pass.

    Viewers of the model's team may read, maintainers ``POST .../<id>/run/`` (gates still decide);
    creating, editing (``PATCH``), deleting, ``pause/`` and ``resume/`` need an owner.
    """

    lookup_value_regex = "[0-9]+"  # ASCII digits: int() of anything else would be a 500

    serializer_class = PromotionPolicySerializer
    queryset = PromotionPolicy.objects.select_related("model", "created_by").order_by("id")
    ordering = "id"
    filterset_class = PromotionPolicyFilter
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        """Policies of the models the principal may read."""
        return scope_team_filter(Principal.of(self.request), self.queryset, "model__team")

    def _policy_for(self, action: Action) -> PromotionPolicy:
        """The policy of the URL once the principal may do ``action`` on its model (404 if unreadable, else 403)."""
        policy = self.get_object()
        require(Principal.of(self.request), action, model=policy.model)
        return policy

    def _show(self, pk: int) -> dict:
        return PromotionPolicySerializer(self.queryset.get(pk=pk)).data

    @extend_schema(request=PromotionPolicyWriteSerializer, responses={201: PromotionPolicySerializer})
    def create(self, request, *args, **kwargs):
        data = PromotionPolicyWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        model_for(Principal.of(request), fields["model"], Action.MANAGE_POLICY)
        policy = create_policy(model_name=fields.pop("model"), actor=request.user, **fields)
        return Response(self._show(policy.pk), status=status.HTTP_201_CREATED)

    @extend_schema(request=PromotionPolicyWriteSerializer, responses={200: PromotionPolicySerializer})
    def partial_update(self, request, *args, **kwargs):
        data = PromotionPolicyWriteSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        fields = dict(data.validated_data)
        if "model" in fields:
            raise InvalidInput("a policy's model cannot change; create a policy for the other model")
        self._policy_for(Action.MANAGE_POLICY)
        policy = update_policy(int(kwargs["pk"]), actor=request.user, **fields)
        return Response(self._show(policy.pk))

    def destroy(self, request, *args, **kwargs):
        self._policy_for(Action.MANAGE_POLICY)
        delete_policy(int(kwargs["pk"]), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={202: PromotionEvaluationSerializer})
    @action(detail=True, methods=["post"])
    def run(self, request, pk=None):
        """Queue an evaluation now; poll ``/api/v1/promotion-evaluations/<id>/`` until ``final``."""
        self._policy_for(Action.RUN_POLICY)
        evaluation = request_evaluation(int(pk), actor=request.user)
        return Response(_evaluation_data(evaluation.pk), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: PromotionPolicySerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        """Stop the schedule (run-now still works); idempotent."""
        self._policy_for(Action.MANAGE_POLICY)
        set_policy_enabled(int(pk), False, actor=request.user)
        return Response(self._show(pk))

    @extend_schema(request=None, responses={200: PromotionPolicySerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        """Run the schedule again; idempotent."""
        self._policy_for(Action.MANAGE_POLICY)
        set_policy_enabled(int(pk), True, actor=request.user)
        return Response(self._show(pk))


class PromotionEvaluationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Evaluations of promotion policies, newest first (``?policy=``, ``?decision=``, ``?model=``).

    ``POST .../<id>/approve/`` and ``reject/`` (owners of the model's team) decide one awaiting approval; 409
    otherwise, or when the target alias moved since it was evaluated.
    """

    lookup_value_regex = "[0-9]+"  # ASCII digits: int() of anything else would be a 500

    serializer_class = PromotionEvaluationSerializer
    queryset = EVALUATIONS.order_by("-id")
    ordering = "-id"
    filterset_class = PromotionEvaluationFilter

    def get_queryset(self):
        """Evaluations of the models the principal may read."""
        return scope_team_filter(Principal.of(self.request), self.queryset, "policy__model__team")

    def _decidable(self) -> PromotionEvaluation:
        """The evaluation of the URL once the principal is an owner of its model's team (404 if unreadable)."""
        evaluation = self.get_object()
        require(Principal.of(self.request), Action.MANAGE_POLICY, model=evaluation.policy.model)
        return evaluation

    @extend_schema(request=None, responses={200: PromotionEvaluationSerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        """Approve: the target alias moves to the evaluated candidate version."""
        self._decidable()
        approve_evaluation(int(pk), actor=request.user)
        return Response(_evaluation_data(int(pk)))

    @extend_schema(request=RejectSerializer, responses={200: PromotionEvaluationSerializer})
    @action(detail=True, methods=["post"])
    def reject(self, request, pk=None):
        """Reject: nothing moves."""
        data = RejectSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        self._decidable()
        reject_evaluation(int(pk), actor=request.user, reason=data.validated_data["reason"])
        return Response(_evaluation_data(int(pk)))


class WebhookViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, mixins.UpdateModelMixin,
    mixins.DestroyModelMixin, viewsets.GenericViewSet,
):
    """Webhooks told about registry events, promotions and rollout outcomes.

    A webhook of one ``team`` is managed (read, changed, deleted) by that team's owners, one of every
    team by administrators only; the list shows the webhooks the principal manages. Others' webhooks
    of a team the principal sees answer 403, of any other 404. Changes need the ``write`` scope
    (``admin`` for a webhook of every team). URLs resolving to loopback, private or link-local
    addresses are refused (400). ``GET .../<id>/deliveries/`` lists the latest 100 deliveries with
    their attempts and errors.
    """

    lookup_value_regex = "[0-9]+"  # ASCII digits: int() of anything else would be a 500

    serializer_class = WebhookSerializer
    queryset = Webhook.objects.select_related("model", "team").order_by("id")
    ordering = "id"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        """Webhooks of the teams the principal sees (every webhook for an administrator)."""
        principal = Principal.of(self.request)
        if principal.is_admin:
            return self.queryset
        return self.queryset.filter(team__in=principal.team_ids())

    def get_object(self):
        hook = super().get_object()
        self._require_manager(hook.team)
        return hook

    def _require_manager(self, team) -> None:
        """Refuse (403) unless the principal may manage webhooks of ``team`` (None: of every team)."""
        principal = Principal.of(self.request)
        if team is None:
            if not principal.is_admin:
                raise Forbidden("a webhook of every team is managed by administrators only; name your team")
            return
        require(principal, Action.MANAGE_WEBHOOKS, team=team)

    def list(self, request, *args, **kwargs):
        principal = Principal.of(request)
        hooks = self.get_queryset()
        if not principal.is_admin:
            hooks = hooks.filter(team__in=principal.team_ids(Role.OWNER))
        page = self.paginate_queryset(self.filter_queryset(hooks))
        return self.get_paginated_response(WebhookSerializer(page, many=True).data)

    def _refuse_unseen_team(self) -> None:
        """A team the principal is not a member of is refused alike whether it exists or not (403), so
        team names do not leak through the serializer's "does not exist"."""
        principal = Principal.of(self.request)
        name = self.request.data.get("team") if hasattr(self.request.data, "get") else None
        if isinstance(name, str) and name and not principal.is_admin:
            team = Team.objects.filter(name=name).first()
            if team is None or principal.role_in(team.pk) is None:
                raise Forbidden(f"managing the webhooks of team {name!r} needs the owner role there "
                                "(you are not a member)")

    @extend_schema(request=WebhookSerializer, responses={201: WebhookCreatedSerializer})
    def create(self, request, *args, **kwargs):
        self._refuse_unseen_team()
        data = WebhookSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        self._require_manager(data.validated_data.get("team"))
        self._check_model(data.validated_data.get("model"))
        hook = webhooks.create_webhook(actor=request.user, **data.validated_data)
        return Response(WebhookCreatedSerializer(hook).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=WebhookSerializer, responses={200: WebhookSerializer})
    def partial_update(self, request, *args, **kwargs):
        self.get_object()
        self._refuse_unseen_team()
        data = WebhookSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        if "team" in data.validated_data:  # moving it to another team (or to every team) needs rights there too
            self._require_manager(data.validated_data["team"])
        self._check_model(data.validated_data.get("model"))
        hook = webhooks.update_webhook(int(kwargs["pk"]), actor=request.user, **data.validated_data)
        return Response(WebhookSerializer(hook).data)

    @extend_schema(responses={204: None, **error_responses(403, 404)})
    def destroy(self, request, *args, **kwargs):
        webhooks.delete_webhook(self.get_object().pk, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _check_model(self, model) -> None:
        """A model the principal cannot read is answered as a missing one (400), so names do not leak."""
        if model is not None and not can_see(Principal.of(self.request), model):
            raise InvalidInput(f"no model named {model.name!r}")

    @extend_schema(responses={200: WebhookDeliverySerializer(many=True)})
    @action(detail=True, methods=["get"])
    def deliveries(self, request, pk=None):
        """The latest 100 deliveries to this webhook, newest first."""
        hook = self.get_object()
        return Response(WebhookDeliverySerializer(hook.deliveries.order_by("-id")[:100], many=True).data)
