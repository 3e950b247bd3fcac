"""Signals the registry sends for other apps to act on."""

from django.dispatch import Signal

# Sent inside the transaction that created or moved an alias, after its audit event.
# Keyword arguments: ``model`` (RegisteredModel), ``alias`` (str), ``version`` (ModelVersion),
# ``actor`` (the user or None). Receivers that start work should do so on commit.
alias_moved = Signal()
