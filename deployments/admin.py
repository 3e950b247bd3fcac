from django.contrib import admin

from deployments.models import Deployment, DeploymentTarget, ServingHost, TargetEvent


@admin.register(ServingHost)
class ServingHostAdmin(admin.ModelAdmin):
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
