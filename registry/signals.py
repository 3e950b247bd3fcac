"""Signals the registry sends for other apps to act on."""

from django.dispatch import Signal

# Sent inside the transaction that created or moved an alias, after its audit event.
# Keyword arguments: ``model`` (RegisteredModel), ``alias`` (str), ``version`` (ModelVersion),
# ``previous`` (the version number it named before, or None), ``reason`` (str, may be empty),
# ``actor`` (the user, an automated actor with ``username``, or None). Receivers that start work
# should do so on commit.
alias_moved = Signal()

# Sent inside the transaction that registered a version, after its audit event.
# Keyword arguments: ``model`` (RegisteredModel), ``version`` (ModelVersion, READY), ``actor``.
version_registered = Signal()

# Sent inside the transaction that deleted a version, after its audit event.
# Keyword arguments: ``model`` (RegisteredModel), ``version`` (ModelVersion, now DELETED), ``actor``.
version_deleted = Signal()

# Sent inside the transaction that changed a model's tags, after its audit event.
# Keyword arguments: ``model`` (RegisteredModel), ``before`` and ``after`` (dicts of str to str), ``actor``.
model_tags_changed = Signal()

# Sent while deciding whether a version may be deleted (``registry.deletion.delete_version``).
# Keyword arguments: ``version`` (ModelVersion). Each receiver returns a list of phrases, one per
# reason the version must stay (e.g. "host(s) gpu-0 serve it"), or an empty list; it must not write.
version_deletion_check = Signal()

# Sent inside the transaction that marked a version CORRUPT (``registry.integrity``), after its
# audit event. Keyword arguments: ``version`` (ModelVersion), ``reason`` (str).
version_corrupt = Signal()

# Sent by the models list to learn what serves the models of its page; nothing is written. Keyword
# arguments: ``models`` (a list of RegisteredModel). Each receiver returns ``{model pk: [{"version":
# number, "hosts": [host names]}]}`` for the models that serve somewhere (the deployments app knows).
serving_lookup = Signal()

# Sent by the compare page (``registry.views.version_compare``) to learn what other apps show about two
# versions; nothing is written. Keyword arguments: ``a`` (ModelVersion, the one in use) and ``b`` (the
# one replacing it). Each receiver returns ``{"template": a partial's name, "context": dict}`` (the
# partial is included in the page with ``panel`` set to that context), or None to add nothing.
comparison_panels = Signal()

# Sent inside the transaction that changed a model's request capture settings, after its audit event.
# Keyword arguments: ``model`` (RegisteredModel, with the new settings), ``before`` and ``after``
# (``{"fraction", "max_bytes", "retention_seconds"}``), ``actor``. Each receiver returns a list of warnings
# (phrases naming a host the settings cannot reach now); receivers that send work do so on commit.
capture_changed = Signal()

# Sent inside the transaction that created or revoked an inference key, or switched a model's requirement of one,
# after its audit event. Keyword arguments: ``models`` (the RegisteredModels whose accepted keys changed),
# ``actor``. Receivers that send work should do so on commit.
inference_keys_changed = Signal()
