"""Admin pages of the deployments app (administrators only, as the whole admin site)."""

from django import forms
from django.contrib import admin

from deployments.endpoints import normalise_url
from deployments.hosts import check_host_overrides
from deployments.models import Deployment, DeploymentTarget, ServingHost, TargetEvent
from modelyard.errors import InvalidInput
from modelyard.forms import FullLengthModelForm
from modelyard_agent.formats.names import InvalidName, validate_name


class ServingHostAdminForm(FullLengthModelForm):
    """The host form, with the checks of the API: the name grammar (it names a Celery queue and a
    directory), normalised URLs without credentials, and only ``parameters`` in config overrides."""

    # Plain text: the endpoint check below is the one the API uses (Django's URL validator would
    # both let credentials through and refuse forms the check normalises).
    inference_url = forms.CharField(max_length=200, help_text="e.g. http://gpu-0:8000")
    metrics_url = forms.CharField(max_length=200, required=False, help_text="e.g. http://gpu-0:8002/metrics")

    class Meta:
        model = ServingHost
        fields = ["name", "runtime", "inference_url", "metrics_url", "config_overrides", "labels", "production",
                  "load_deadline", "unload_deadline"]

    def clean_name(self) -> str:
        try:
            return validate_name(self.cleaned_data["name"], kind="host name")
        except InvalidName as exc:
            raise forms.ValidationError(str(exc)) from exc

    def _url(self, field: str) -> str:
        value = (self.cleaned_data.get(field) or "").strip()
        if not value:
            return ""
        try:
            return normalise_url(value, field, path_allowed=field == "metrics_url")
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message) from exc

    def clean_inference_url(self) -> str:
        return self._url("inference_url")

    def clean_metrics_url(self) -> str:
        return self._url("metrics_url")

    def clean_config_overrides(self) -> dict:

        try:
            return check_host_overrides(self.cleaned_data.get("config_overrides"))
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message) from exc


@admin.register(ServingHost)
class ServingHostAdmin(admin.ModelAdmin):
    form = ServingHostAdminForm
    list_display = ["name", "runtime", "production", "inference_url", "metrics_url"]
    list_filter = ["runtime", "production"]


class DeploymentTargetInline(admin.TabularInline):
    model = DeploymentTarget
    extra = 0
    readonly_fields = ["host", "state", "error", "details", "updated_at"]


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["id", "model", "version", "created_at"]
    inlines = [DeploymentTargetInline]


@admin.register(TargetEvent)
class TargetEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "target", "from_state", "to_state"]
