from django.apps import AppConfig


class PromotionsConfig(AppConfig):
    """Scheduled, metric-gated promotion policies and the webhooks that report them."""

    name = "promotions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from deployments.signals import rollout_finished
        from promotions.webhooks import on_rollout_finished, on_version_corrupt
        from registry.signals import version_corrupt

        rollout_finished.connect(on_rollout_finished, dispatch_uid="promotions.rollout_webhooks")
        version_corrupt.connect(on_version_corrupt, dispatch_uid="promotions.version_corrupt_webhooks")
