"""Remove DRF's ``authtoken_token`` table, which kept API keys in clear, if an older install has it.

Its keys stop working with the switch to ``accounts.ApiToken`` (digests only); make new tokens with
``manage.py create_api_token`` or /account/tokens/. Not reversible: the keys are gone for good.
"""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0001_teams_tokens"),
    ]

    operations = [
        migrations.RunSQL(
            sql=[
                "DROP TABLE IF EXISTS authtoken_token",
                "DELETE FROM django_migrations WHERE app = 'authtoken'",
            ],
            reverse_sql=migrations.RunSQL.noop,
        ),
    ]
