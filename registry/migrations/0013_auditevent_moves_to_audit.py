"""The audit log moved to the ``audit`` app (``audit/migrations/0001_initial.py``) with its table;
the registry forgets the model in Django's state only, so no row is touched."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("registry", "0012_host_team_actions"),
        ("audit", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.DeleteModel(name="AuditEvent")],
                                            database_operations=[]),
    ]
