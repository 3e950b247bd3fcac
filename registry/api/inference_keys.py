"""Inference keys API: list, create (the key shown once), read and revoke a team's inference keys."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts.access import Action, Principal, require, scope_team_filter
from modelyard.api import error_responses
from modelyard.errors import NotFound
from registry.access import model_for
from registry.api.serializers import (
    InferenceKeyCreatedSerializer,
    InferenceKeyCreateSerializer,
    InferenceKeySerializer,
)
from registry.inference_keys import create_inference_key, revoke_inference_key
from registry.models import InferenceKey


class InferenceKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Inference keys of the teams you belong to, newest first.

    Reading a team's keys needs a role in the team; ``POST`` (a key for models of one team) and
    ``POST .../<id>/revoke/`` need its owner role. ``POST`` answers the ``key`` this once: only its
    SHA-256 digest is stored. A key of a team you are not in answers 404, as a missing one.
    """

    lookup_value_regex = "[0-9]+"  # ASCII digits: int() of anything else would be a 500
    serializer_class = InferenceKeySerializer
    ordering = "-id"

    def get_queryset(self):
        keys = InferenceKey.objects.select_related("team", "created_by").prefetch_related("scoped_models")
        if getattr(self, "swagger_fake_view", False):
            return keys.none()
        keys = scope_team_filter(Principal.of(self.request), keys, "team").order_by("-id")
        if self.action == "list":
            params = self.request.query_params
            if params.get("team"):
                keys = keys.filter(team__name=params["team"])
            if params.get("model"):
                keys = keys.filter(scoped_models__name=params["model"])
        return keys

    def get_object(self):
        key = self.get_queryset().filter(pk=int(self.kwargs["pk"])).first()
        if key is None:
            raise NotFound(f"no inference key {self.kwargs['pk']}")
        return key

    @extend_schema(parameters=[
        OpenApiParameter("team", OpenApiTypes.STR, description="only this team's keys"),
        OpenApiParameter("model", OpenApiTypes.STR, description="only the keys that open this model"),
    ], responses={200: InferenceKeySerializer(many=True)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: InferenceKeySerializer, **error_responses(404)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(request=InferenceKeyCreateSerializer,
                   responses={201: InferenceKeyCreatedSerializer, **error_responses(400, 403, 404)})
    def create(self, request, *args, **kwargs):
        data = InferenceKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        principal = Principal.of(request)
        models = [model_for(principal, name, Action.MANAGE_INFERENCE_KEYS) for name in fields["models"]]
        key, plaintext = create_inference_key(name=fields["name"], models=models, expires_at=fields["expires_at"],
                                              actor=request.user)
        key = self.get_queryset().get(pk=key.pk)
        key.key = plaintext
        answer = Response(InferenceKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED)
        answer["Cache-Control"] = "no-store"  # the answer carries a secret
        return answer

    @extend_schema(request=None, responses={200: InferenceKeySerializer, **error_responses(403, 404)})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the key now (idempotent); the row stays for the audit trail."""
        key = self.get_object()
        require(Principal.of(request), Action.MANAGE_INFERENCE_KEYS, team=key.team)
        return Response(InferenceKeySerializer(revoke_inference_key(key, request.user)).data)
