"""Serializers of the API tokens API."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.choices import Scope
from accounts.models import ApiToken
from accounts.tokens import DEFAULT_EXPIRY_DAYS, NAME_MAX_LENGTH, token_state
from modelyard.api import RefuseUnknownFields

TOKEN_STATES = ["active", "expired", "revoked"]


class ApiTokenSerializer(serializers.ModelSerializer):
    """An API token as the API shows it: never its secret, which is not stored."""

    user = serializers.SlugRelatedField(slug_field="username", read_only=True)
    team = serializers.SlugRelatedField(slug_field="name", read_only=True, allow_null=True)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), read_only=True)
    state = serializers.SerializerMethodField(help_text="active, expired or revoked")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "user", "scopes", "team", "state", "created_at", "expires_at",
                  "revoked_at", "last_used_at"]
        read_only_fields = fields

    @extend_schema_field(serializers.ChoiceField(choices=TOKEN_STATES))
    def get_state(self, token: ApiToken) -> str:
        return token_state(token)


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    """The answer to creating a token: the token with its plaintext, shown this once."""

    token = serializers.CharField(read_only=True, help_text="send as 'Authorization: Bearer <token>'; "
                                                            "shown only in this answer")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]
        read_only_fields = fields


class ApiTokenCreateSerializer(RefuseUnknownFields, serializers.Serializer):
    """Input of ``POST /api/v1/tokens/``: a token for the requesting user.

    The service checks the rest (admin scope for administrators only, team membership, a token
    making a token may not grant more than it has) and answers 400 or 403 with a sentence.
    """

    name = serializers.CharField(max_length=NAME_MAX_LENGTH)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), min_length=1,
                                   help_text="what the token may do: read, write, deploy, admin")
    team = serializers.CharField(max_length=63, required=False, allow_null=True, default=None,
                                 help_text="limit the token to this team's models (a team you are a member of)")
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True,
        help_text=f"ISO 8601, in the future; null for no expiry; left out: {DEFAULT_EXPIRY_DAYS} days from now "
                  "(a token created with an expiring token expires with it at the latest)")


class WhoAmISerializer(serializers.Serializer):
    """Who a request is authenticated as."""

    username = serializers.CharField()
    auth = serializers.ChoiceField(choices=["token", "session"], help_text="how the request was authenticated")
    token = serializers.CharField(allow_null=True, help_text="the API token's name; null for a browser session")
    scopes = serializers.ListField(child=serializers.CharField(), allow_null=True,
                                   help_text="the token's scopes; null for a browser session (no scope limit)")
