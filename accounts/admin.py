"""Admin pages for teams, memberships and API tokens (administrators only, as the whole admin site)."""

from django import forms
from django.contrib import admin

from accounts.models import ApiToken, Membership, Team
from modelyard.forms import FullLengthModelForm
from modelyard_agent.formats.names import InvalidName, validate_name


class TeamAdminForm(FullLengthModelForm):
    """The team form, holding names to the same grammar as the API (lower case, digits, ``-``, ``_``)."""

    class Meta:
        model = Team
        fields = ["name", "description"]

    def clean_name(self) -> str:
        try:
            return validate_name(self.cleaned_data["name"], kind="team name")
        except InvalidName as exc:
            raise forms.ValidationError(str(exc)) from exc


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    form = TeamAdminForm
    list_display = ["name", "description", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are listed and revoked here; their secret is never stored, so never shown."""

    list_display = ["name", "user", "prefix", "scopes", "team", "created_at", "expires_at", "revoked_at",
                    "last_used_at"]
    list_filter = ["team"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = ["prefix", "digest", "created_at", "last_used_at"]
