"""API tokens API: list, create (the secret shown once), read and revoke your tokens."""

from django.contrib.auth import get_user_model
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.access import Principal
from accounts.api.serializers import (
    ApiTokenCreatedSerializer,
    ApiTokenCreateSerializer,
    ApiTokenSerializer,
    WhoAmISerializer,
)
from accounts.models import ApiToken
from accounts.tokens import default_expiry, find_team, issue_token, revoke_token
from modelyard.api import error_responses
from modelyard.errors import Forbidden, NotFound


class ApiTokenViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your API tokens, newest first; administrators may list anyone's with ``?user=<username>``.

    ``POST`` makes a token for you and answers its ``token`` (send it as ``Authorization: Bearer
    <token>``) this once: only its SHA-256 digest is stored. A request authenticated with a token
    can only make tokens with scopes that token has, within its team limit and its expiry.
    ``DELETE`` (204) or ``POST .../<id>/revoke/`` (200) revoke one; the row stays for the audit
    trail. Others' tokens answer 404, except to administrators.
    """

    lookup_value_regex = "[0-9]+"  # ASCII digits: int() of anything else would be a 500

    serializer_class = ApiTokenSerializer
    ordering = "-id"

    def get_queryset(self):
        tokens = ApiToken.objects.select_related("user", "team").order_by("-id")
        if getattr(self, "swagger_fake_view", False):
            return tokens.none()
        principal = Principal.of(self.request)
        user = self.request.user
        if self.action == "list":
            username = self.request.query_params.get("user") or user.get_username()
            if username == user.get_username():
                return tokens.filter(user=user)
            if not principal.is_admin:
                raise Forbidden("only administrators may list other users' tokens")
            if not get_user_model().objects.filter(username=username).exists():
                raise NotFound(f"no user named {username!r}")
            return tokens.filter(user__username=username)
        return tokens if principal.is_admin else tokens.filter(user=user)

    def get_object(self):
        token = self.get_queryset().filter(pk=int(self.kwargs["pk"])).first()
        if token is None:
            raise NotFound(f"no API token {self.kwargs['pk']} of yours")
        return token

    @extend_schema(parameters=[OpenApiParameter("user", OpenApiTypes.STR, description=(
        "list this user's tokens (administrators only); your own by default"))],
        responses={200: ApiTokenSerializer(many=True), **error_responses(403, 404)})
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: ApiTokenSerializer, **error_responses(404)})
    def retrieve(self, request, *args, **kwargs):
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(request=ApiTokenCreateSerializer, responses={201: ApiTokenCreatedSerializer,
                                                                **error_responses(403, 404)})
    def create(self, request, *args, **kwargs):
        data = ApiTokenCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        fields = data.validated_data
        via = request.auth if isinstance(request.auth, ApiToken) else None
        token, plaintext = issue_token(
            user=request.user, name=fields["name"], scopes=fields["scopes"],
            team=find_team(request.user, fields["team"]) if fields["team"] else None,
            expires_at=fields["expires_at"] if "expires_at" in fields else default_expiry(via), actor=request.user,
            via=via)
        token.token = plaintext
        answer = Response(ApiTokenCreatedSerializer(token).data, status=status.HTTP_201_CREATED)
        answer["Cache-Control"] = "no-store"  # the answer carries a secret
        return answer

    @extend_schema(responses={204: None, **error_responses(403, 404)})
    def destroy(self, request, *args, **kwargs):
        revoke_token(self.get_object(), request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: ApiTokenSerializer, **error_responses(403, 404)})
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        """Revoke the token now (idempotent); it answers 401 from then on."""
        return Response(ApiTokenSerializer(revoke_token(self.get_object(), request.user)).data)


class WhoAmIView(APIView):
    """``GET /api/v1/whoami/``: who the request is authenticated as (a CI job's check of its token).

    Built from what authentication already loaded, with no query of its own: its time is the floor of
    every API answer (the server, the middleware and authentication alone), which the registry
    benchmark reports beside the registry's reads (``bench/registry_vs_mlflow.py``).
    """

    @extend_schema(responses={200: WhoAmISerializer, **error_responses(401)})
    def get(self, request):
        token = request.auth if isinstance(request.auth, ApiToken) else None
        return Response({"username": request.user.get_username(), "auth": "token" if token else "session",
                         "token": token.name if token else None, "scopes": list(token.scopes) if token else None})
