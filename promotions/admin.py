from django.contrib import admin

from modelyard.forms import FullLengthModelForm
from promotions.forms import WebhookAdminForm
from promotions.models import PromotionEvaluation, PromotionPolicy, Webhook, WebhookDelivery


@admin.register(PromotionPolicy)
class PromotionPolicyAdmin(admin.ModelAdmin):
    form = FullLengthModelForm
    list_display = ["id", "model", "candidate_alias", "target_alias", "schedule", "enabled", "dry_run"]
    readonly_fields = ["periodic_task"]  # written by promotions.policies with the schedule


@admin.register(PromotionEvaluation)
class PromotionEvaluationAdmin(admin.ModelAdmin):
    list_display = ["id", "policy", "decision", "created_at"]
    list_filter = ["decision"]


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    form = WebhookAdminForm
    list_display = ["id", "url", "events", "team", "enabled"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ["id", "webhook", "event", "status", "attempts", "created_at"]
