"""Admin pages of the registry (administrators only, as the whole admin site)."""

from django import forms
from django.contrib import admin

from audit.models import AuditEvent
from modelyard.forms import FullLengthModelForm
from modelyard_agent.formats.names import InvalidName, validate_name
from registry.models import ModelVersion, RegisteredModel


class RegisteredModelAdminForm(FullLengthModelForm):
    """The model form, holding names to the grammar the API and pages use (``modelyard_agent.formats.names``)."""

    class Meta:
        model = RegisteredModel
        # next_version is never edited: version numbers are never reused.
        fields = ["name", "team", "description", "tags"]

    def clean_name(self) -> str:
        try:
            return validate_name(self.cleaned_data["name"], kind="model name")
        except InvalidName as exc:
            raise forms.ValidationError(str(exc)) from exc


@admin.register(RegisteredModel)
class RegisteredModelAdmin(admin.ModelAdmin):
    form = RegisteredModelAdminForm
    list_display = ["name", "team", "next_version", "created_at"]
    readonly_fields = ["next_version", "created_by", "created_at"]
    list_filter = ["team"]
    search_fields = ["name"]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["model", "version", "status", "artifact_size", "created_at"]
    list_filter = ["status"]
    readonly_fields = ["artifact_key", "artifact_sha256", "artifact_size", "config_text", "signature"]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "action", "actor_label", "object_type", "object_id"]
    list_filter = ["action"]

    def has_add_permission(self, request):
        return False  # the services write the audit log, nobody by hand

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
