"""The registry's GIN indexes (0018: trigram indexes on names and descriptions, ``tags`` of models and versions)
take each new row at once (``fastupdate = off``) instead of queueing it in a pending list until the next vacuum.

A pending list is read in full by every search that uses the index, and by the planner's estimate of it: after
a bulk registration, or between autovacuum's visits, a name substring search of 10,000 models took 3.7 ms in the
trigram index instead of 0.02 ms, so the planner chose a sequential scan (3 ms) instead
(``bench/results/registry_vs_mlflow.md``). A registry inserts few rows a second, so taking each into the index at
once costs it little. The lists already pending are merged here (``gin_clean_pending_list``).

On SQLite nothing is done (no such indexes).
"""

from django.db import migrations

GIN_INDEXES = ("registry_model_name_trgm", "registry_model_description_trgm", "registry_model_tags_gin",
               "registry_version_tags_gin")


def without_pending_lists(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in GIN_INDEXES:
        schema_editor.execute(f"ALTER INDEX {name} SET (fastupdate = off)")
        schema_editor.execute(f"SELECT gin_clean_pending_list('{name}'::regclass)")


def with_pending_lists(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in GIN_INDEXES:
        schema_editor.execute(f"ALTER INDEX {name} RESET (fastupdate)")


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0019_ensemble_member_order"),
    ]

    operations = [migrations.RunPython(without_pending_lists, with_pending_lists)]
