from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    """Serving hosts, deployments and the host agents that carry them out."""

    name = "deployments"
    default_auto_field = "django.db.models.BigAutoField"
