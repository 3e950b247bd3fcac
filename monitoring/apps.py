from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    """PromQL catalogue, Prometheus client and metrics pages."""

    name = "monitoring"
    default_auto_field = "django.db.models.BigAutoField"
