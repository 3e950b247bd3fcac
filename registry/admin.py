from django.contrib import admin

from registry.models import AuditEvent, ModelVersion, RegisteredModel


@admin.register(RegisteredModel)
class RegisteredModelAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "next_version", "created_at"]
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
