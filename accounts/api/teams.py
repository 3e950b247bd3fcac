"""Teams API: ``/api/v1/teams/`` (serializers and views).

Members see their teams with every member's role; administrators see and change all of them:
create and delete teams, and ``PUT``/``DELETE /api/v1/teams/<name>/members/<username>/`` to give
a user a role or take it away.
"""

from django.contrib.auth import get_user_model
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from accounts import services
from accounts.access import Action, Principal, require
from accounts.choices import Role, Scope
from accounts.models import Membership, Team
from modelyard.api import RefuseUnknownFields, error_responses
from modelyard.errors import NotFound
from modelyard_agent.formats.names import InvalidName, validate_name


class MembershipSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    """A member of a team and their role."""

    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]
        read_only_fields = fields


class TeamSerializer(RefuseUnknownFields, serializers.ModelSerializer):
    """A team with its members."""

    members = MembershipSerializer(source="memberships", many=True, read_only=True)

    class Meta:
        model = Team
        fields = ["name", "description", "members", "created_at"]
        read_only_fields = ["members", "created_at"]
        validators = []  # a taken name is the view's 409

    def validate_name(self, value: str) -> str:
        try:
            return validate_name(value, kind="team name")
        except InvalidName as exc:
            raise serializers.ValidationError(str(exc)) from exc


class RoleSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``PUT /api/v1/teams/<name>/members/<username>/``."""

    role = serializers.ChoiceField(choices=Role.choices)


class TeamViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                  mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Teams, looked up by name: members read their own, administrators manage all."""

    serializer_class = TeamSerializer
    required_scope = Scope.ADMIN
    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    ordering = "name"

    def get_queryset(self):
        teams = Team.objects.prefetch_related("memberships__user").order_by("name")
        ids = Principal.of(self.request).team_ids()
        return teams if ids is None else teams.filter(pk__in=ids)

    @extend_schema(responses={201: TeamSerializer, **error_responses(403, 409)})
    def create(self, request, *args, **kwargs):
        require(Principal.of(request), Action.ADMIN)
        data = TeamSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        team = services.create_team(name=data.validated_data["name"],
                                    description=data.validated_data.get("description", ""), actor=request.user)
        return Response(TeamSerializer(team).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None, **error_responses(403, 404, 409)},
                   description="Delete a team; 409 while it owns models or usable API tokens are limited to it.")
    def destroy(self, request, *args, **kwargs):
        require(Principal.of(request), Action.ADMIN)
        services.delete_team(team=self.get_object(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(methods=["PUT"], request=RoleSerializer, responses={200: MembershipSerializer,
                                                                       **error_responses(403, 404)})
    @extend_schema(methods=["DELETE"], request=None, responses={204: None, **error_responses(403, 404)})
    @action(detail=True, methods=["put", "delete"], url_path=r"members/(?P<username>[^/]+)")
    def member(self, request, name=None, username=None):
        """``PUT {"role": ...}`` gives ``username`` that role in the team; ``DELETE`` removes them (administrators)."""
        require(Principal.of(request), Action.ADMIN)
        team = self.get_object()
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise NotFound(f"no user named {username!r}")
        if request.method == "DELETE":
            services.remove_membership(team=team, user=user, actor=request.user)
            return Response(status=status.HTTP_204_NO_CONTENT)
        data = RoleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        membership = services.set_membership(team=team, user=user, role=data.validated_data["role"],
                                             actor=request.user)
        return Response(MembershipSerializer(membership).data)
