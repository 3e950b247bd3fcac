from django.apps import AppConfig


class PromotionsConfig(AppConfig):
    """Scheduled, metric-gated promotion policies and the webhooks that report them and the registry's events."""

    name = "promotions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Connect the app's webhook receivers (``promotions.receivers``)."""
        from promotions import receivers  # noqa: F401 - connects on import; the models are loaded only now
