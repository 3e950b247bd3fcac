"""Every registered model belongs to a team; models registered before teams existed go to ``default``."""

import django.db.models.deletion
from django.db import migrations, models

import accounts.services


def assign_default_team(apps, schema_editor):
    Team = apps.get_model("accounts", "Team")
    RegisteredModel = apps.get_model("registry", "RegisteredModel")
    if RegisteredModel.objects.filter(team__isnull=True).exists():
        team, _ = Team.objects.get_or_create(
            name="default", defaults={"description": "Models registered before teams existed"}
        )
        RegisteredModel.objects.filter(team__isnull=True).update(team=team)


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0001_teams_tokens"),
        ("registry", "0009_host_model_actions"),
    ]

    operations = [
        migrations.AddField(
            model_name="registeredmodel",
            name="team",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.PROTECT, related_name="models", to="accounts.team"
            ),
        ),
        migrations.RunPython(assign_default_team, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="registeredmodel",
            name="team",
            field=models.ForeignKey(
                default=accounts.services.default_team_id, on_delete=django.db.models.deletion.PROTECT,
                related_name="models", to="accounts.team",
            ),
        ),
    ]
