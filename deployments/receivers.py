"""What deployments does when the registry's signals fire; connected when this module is imported, from
``DeploymentsConfig.ready()``.

- an alias moved: the rollouts that follow it start (``rollouts.on_alias_moved``);
- a version is to be deleted: the hosts still serving it refuse the deletion
  (``served.hosts_keeping_version``);
- the registry's pages ask what serves (``serving.serving_by_model``) and for the performance-card
  comparison panel (``profiles.comparison_panel``);
- a model's capture settings changed: its hosts' gateways are told (``capture.on_capture_changed``);
- an inference key or a model's requirement of one changed: its hosts' fronts are sent the model's keys
  (``inference_keys.on_inference_keys_changed``).
"""

from deployments.capture import on_capture_changed
from deployments.inference_keys import on_inference_keys_changed
from deployments.profiles import comparison_panel
from deployments.rollouts import on_alias_moved
from deployments.served import hosts_keeping_version
from deployments.serving import serving_by_model
from registry.signals import (
    alias_moved,
    capture_changed,
    comparison_panels,
    inference_keys_changed,
    serving_lookup,
    version_deletion_check,
)

alias_moved.connect(on_alias_moved, dispatch_uid="deployments.follow_alias")
version_deletion_check.connect(hosts_keeping_version, dispatch_uid="deployments.hosts_keeping_version")
serving_lookup.connect(serving_by_model, dispatch_uid="deployments.serving_by_model")
comparison_panels.connect(comparison_panel, dispatch_uid="deployments.comparison_panel")
capture_changed.connect(on_capture_changed, dispatch_uid="deployments.send_capture")
inference_keys_changed.connect(on_inference_keys_changed, dispatch_uid="deployments.send_inference_keys")
