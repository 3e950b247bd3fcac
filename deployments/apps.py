from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    """Serving hosts, deployments and the host agents that carry them out."""

    name = "deployments"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the app's receivers of the registry's signals (``deployments.receivers``)."""
        from deployments import receivers  # noqa: F401 - connects on import; the models are loaded only now
