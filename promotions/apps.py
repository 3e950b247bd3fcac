from django.apps import AppConfig


class PromotionsConfig(AppConfig):
    """Scheduled, metric-gated promotion policies and the webhooks that report them and the registry's events."""

    name = "promotions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from deployments.signals import rollout_finished
        from promotions import webhooks
        from registry import signals as registry

        rollout_finished.connect(webhooks.on_rollout_finished, dispatch_uid="promotions.rollout_webhooks")
        registry.version_registered.connect(webhooks.on_version_registered, dispatch_uid="promotions.registered")
        registry.version_deleted.connect(webhooks.on_version_deleted, dispatch_uid="promotions.deleted")
        registry.alias_moved.connect(webhooks.on_alias_moved, dispatch_uid="promotions.alias_moved")
        registry.model_tags_changed.connect(webhooks.on_model_tags_changed, dispatch_uid="promotions.tags")
        registry.version_corrupt.connect(webhooks.on_version_corrupt, dispatch_uid="promotions.version_corrupt")
