"""Admin pages of the registry (administrators only, as the whole admin site)."""

from django import forms
from django.contrib import admin

from audit.models import AuditEvent
from modelyard.errors import InvalidInput
from modelyard.forms import FullLengthModelForm
from modelyard_agent.formats.names import InvalidName, validate_name
from registry.models import InferenceKey, ModelVersion, RegisteredModel
from registry.registered_models import validate_tags


class TagsChecked:
    """A model form mixin: ``tags`` held to the API's rule (``registered_models.validate_tags``: string keys to string
    values), so a tag saved in the admin is one that ``?tag=key=value`` finds on every database."""

    def clean_tags(self) -> dict:
        try:
            return validate_tags(self.cleaned_data.get("tags"))
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message) from exc


class RegisteredModelAdminForm(TagsChecked, FullLengthModelForm):
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


class ModelVersionAdminForm(TagsChecked, FullLengthModelForm):
    """A version's admin form: its tags held to the API's rule."""

    class Meta:
        model = ModelVersion
        # What an administrator may correct by hand; the artifact's identity and the model never change.
        fields = ["status", "format", "artifact_filename", "sha256_verified_at", "integrity_error", "artifact_files",
                  "metadata", "tags", "source_commit", "ci_run_url", "training_data_uri", "metrics"]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    form = ModelVersionAdminForm
    list_display = ["model", "version", "status", "artifact_size", "created_at"]
    list_filter = ["status"]
    readonly_fields = ["model", "version", "artifact_key", "artifact_sha256", "artifact_size", "config_text",
                       "signature", "created_by", "created_at"]

    def has_add_permission(self, request):
        return False  # a version is registered with its artifact, through the API or the upload page


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


@admin.register(InferenceKey)
class InferenceKeyAdmin(admin.ModelAdmin):
    """Inference keys are listed here, read only: the key is never stored, and its digest is not shown either
    (revoke a key on its model's page or through the API, so the revocation is audited)."""

    list_display = ["name", "prefix", "team", "created_at", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["team"]
    search_fields = ["name", "prefix", "team__name"]
    exclude = ["digest"]
    readonly_fields = ["team", "name", "prefix", "scoped_models", "created_by", "created_at", "expires_at",
                       "revoked_at", "last_used_at"]

    def has_add_permission(self, request) -> bool:
        return False  # a key made here would never show its secret to anyone
