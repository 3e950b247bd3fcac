"""Database helpers shared by the apps: Unicode case folding that works on SQLite as on PostgreSQL, and reads
that outlive a schema change on PostgreSQL's prepared statements.

SQLite's ``LIKE`` and ``LOWER`` fold ASCII letters only, so a search for ``école`` would miss
``ÉCOLE`` there while PostgreSQL finds it. ``CaseFold`` is SQL ``LOWER`` on PostgreSQL and, on
SQLite, a function registered on each new connection that applies Python's ``str.casefold``.

With prepared statements (``MODELYARD_DB_PREPARE_THRESHOLD``), a migration that changes the type of a column a
prepared read returns makes PostgreSQL refuse that statement on every connection that prepared it ("cached plan
must not change result type"); ``replan_after_a_schema_change`` runs such a read once more (see there).
"""

from django.db.backends.signals import connection_created
from django.db.models import Func, TextField
from django.db.utils import NotSupportedError

# PostgreSQL's refusal of a prepared statement whose result's row type changed since it was prepared
# (SQLSTATE 0A000, feature_not_supported; src/backend/utils/cache/plancache.c).
CHANGED_RESULT_TYPE = "cached plan must not change result type"

SQLITE_CASEFOLD = "MODELYARD_CASEFOLD"


def _casefold(value):
    return value.casefold() if isinstance(value, str) else value


def register_sqlite_functions(sender, connection, **kwargs) -> None:
    """``connection_created`` receiver: give a new SQLite connection ``MODELYARD_CASEFOLD(text)``."""
    if connection.vendor == "sqlite":
        connection.connection.create_function(SQLITE_CASEFOLD, 1, _casefold, deterministic=True)


connection_created.connect(register_sqlite_functions, dispatch_uid="modelyard-sqlite-casefold")


def replan_after_a_schema_change(execute, sql, params, many, context):
    """Django execute wrapper (every PostgreSQL connection): a statement PostgreSQL refuses because the row type of
    its prepared plan changed (``CHANGED_RESULT_TYPE``, after a migration another process ran) runs once more,
    after ``DEALLOCATE ALL``, so it is planned afresh. Only outside a transaction: inside one the refusal aborted
    it, and the caller's atomic block must see the error.

    Raises:
        NotSupportedError: any other such error, a refusal inside a transaction, or a second refusal.
    """
    try:
        return execute(sql, params, many, context)
    except NotSupportedError as exc:
        if CHANGED_RESULT_TYPE not in str(exc) or not context["connection"].get_autocommit():
            raise
    # The connection's prepared statements all go (the others may be as stale): psycopg forgets its own on
    # seeing the command, and prepares again what runs often enough.
    context["connection"].connection.execute("DEALLOCATE ALL")
    return execute(sql, params, many, context)


def install_replanning(sender, connection, **kwargs) -> None:
    """``connection_created`` receiver: a PostgreSQL connection's statements go through
    ``replan_after_a_schema_change`` (installed once per connection object, whatever its reconnections)."""
    if connection.vendor == "postgresql" and replan_after_a_schema_change not in connection.execute_wrappers:
        connection.execute_wrappers.insert(0, replan_after_a_schema_change)


connection_created.connect(install_replanning, dispatch_uid="modelyard-replan-after-schema-change")


class CaseFold(Func):
    """An expression's text case-folded (Unicode): ``LOWER`` on PostgreSQL, ``str.casefold`` on SQLite."""

    function = "LOWER"
    output_field = TextField()

    def as_sqlite(self, compiler, connection, **extra_context):
        return super().as_sql(compiler, connection, function=SQLITE_CASEFOLD, **extra_context)
