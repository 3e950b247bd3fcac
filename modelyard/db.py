"""Database helpers shared by the apps: Unicode case folding that works on SQLite as on PostgreSQL.

SQLite's ``LIKE`` and ``LOWER`` fold ASCII letters only, so a search for ``école`` would miss
``ÉCOLE`` there while PostgreSQL finds it. ``CaseFold`` is SQL ``LOWER`` on PostgreSQL and, on
SQLite, a function registered on each new connection that applies Python's ``str.casefold``.
"""

from django.db.backends.signals import connection_created
from django.db.models import Func, TextField

SQLITE_CASEFOLD = "MODELYARD_CASEFOLD"


def _casefold(value):
    return value.casefold() if isinstance(value, str) else value


def register_sqlite_functions(sender, connection, **kwargs) -> None:
    """``connection_created`` receiver: give a new SQLite connection ``MODELYARD_CASEFOLD(text)``."""
    if connection.vendor == "sqlite":
        connection.connection.create_function(SQLITE_CASEFOLD, 1, _casefold, deterministic=True)


connection_created.connect(register_sqlite_functions, dispatch_uid="modelyard-sqlite-casefold")


class CaseFold(Func):
    """An expression's text case-folded (Unicode): ``LOWER`` on PostgreSQL, ``str.casefold`` on SQLite."""

    function = "LOWER"
    output_field = TextField()

    def as_sqlite(self, compiler, connection, **extra_context):
        return super().as_sql(compiler, connection, function=SQLITE_CASEFOLD, **extra_context)
