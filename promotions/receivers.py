"""The webhooks promotions sends when the registry's and deployments' signals fire; connected when this
module is imported, from ``PromotionsConfig.ready()``: a rollout finished, a version registered, deleted
or found corrupt, an alias moved, a model's tags changed (``promotions.webhooks``)."""

from deployments.signals import rollout_finished
from promotions import webhooks
from registry import signals as registry

rollout_finished.connect(webhooks.on_rollout_finished, dispatch_uid="promotions.rollout_webhooks")
registry.version_registered.connect(webhooks.on_version_registered, dispatch_uid="promotions.registered")
registry.version_deleted.connect(webhooks.on_version_deleted, dispatch_uid="promotions.deleted")
registry.alias_moved.connect(webhooks.on_alias_moved, dispatch_uid="promotions.alias_moved")
registry.model_tags_changed.connect(webhooks.on_model_tags_changed, dispatch_uid="promotions.tags")
registry.version_corrupt.connect(webhooks.on_version_corrupt, dispatch_uid="promotions.version_corrupt")
