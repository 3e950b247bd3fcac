"""Signals the registry sends for other apps to act on."""

from django.dispatch import Signal

# Sent inside the transaction that created or moved an alias, after its audit event.
# Keyword arguments: ``model`` (RegisteredModel), ``alias`` (str), ``version`` (ModelVersion),
# ``actor`` (the user or None). Receivers that start work should do so on commit.
alias_moved = Signal()

# Sent while deciding whether a version may be deleted (``registry.services.delete_version``).
# Keyword arguments: ``version`` (ModelVersion). Each receiver returns a list of phrases, one per
# reason the version must stay (e.g. "host(s) gpu-0 serve it"), or an empty list; it must not write.
version_deletion_check = Signal()

# Sent inside the transaction that marked a version CORRUPT (``registry.integrity``), after its
# audit event. Keyword arguments: ``version`` (ModelVersion), ``reason`` (str).
version_corrupt = Signal()
