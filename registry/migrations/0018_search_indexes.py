"""Indexes for the registry's searches on PostgreSQL, so that they do not scan the table at 100k models:

- ``?search=`` and ``?name=`` (a substring of the name or description, any case) compare ``UPPER(col::text)
  LIKE UPPER('%...%')``, which Django writes for ``icontains``: trigram GIN indexes on exactly those expressions
  (``pg_trgm``, a trusted extension since PostgreSQL 13, so the database's owner may create it) serve them.
- ``?tag=key`` (``tags ? key``) and ``?tag=key=value`` (``tags @> {"key": "value"}``, ``registry.filters``) on
  models and on versions: GIN indexes on ``tags`` (the default ``jsonb_ops``, which serves both operators).

On SQLite nothing is created: its searches scan the table (see docs/architecture.md, "Registry at scale").
"""

from django.db import migrations

INDEXES = (
    ("registry_model_name_trgm", "registry_registeredmodel", "gin (upper(name::text) gin_trgm_ops)"),
    ("registry_model_description_trgm", "registry_registeredmodel", "gin (upper(description) gin_trgm_ops)"),
    ("registry_model_tags_gin", "registry_registeredmodel", "gin (tags)"),
    ("registry_version_tags_gin", "registry_modelversion", "gin (tags)"),
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for name, table, expression in INDEXES:
        schema_editor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table} USING {expression}")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _, _ in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0017_model_capture_settings"),
    ]

    operations = [migrations.RunPython(create, drop)]
