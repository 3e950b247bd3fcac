"""The audit log moves from the registry app into an app of its own, keeping its table
(``registry_auditevent``) and every row: this changes Django's state only."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('registry', '0012_host_team_actions'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    # The model moves from the registry app with its table: only Django's state changes here.
    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[migrations.CreateModel(
            name='AuditEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('action', models.CharField(choices=[('model.created', 'Model created'), ('model.updated', 'Model description or tags changed'), ('version.registered', 'Version registered'), ('version.deleted', 'Version deleted'), ('upload.started', 'Multipart upload started'), ('upload.aborted', 'Multipart upload aborted'), ('artifacts.collected', 'Unreferenced artifacts removed'), ('alias.set', 'Alias set or moved'), ('alias.deleted', 'Alias deleted'), ('host.registered', 'Serving host registered'), ('host.deleted', 'Serving host deleted'), ('host.updated', 'Serving host changed'), ('deployment.created', 'Deployment created'), ('deployment.changed', 'Rollout paused, resumed, cancelled or rolled back'), ('host_model.unloaded', 'Model unloaded from a host'), ('host_model.reloaded', 'Model reloaded on a host'), ('token.created', 'API token created'), ('token.revoked', 'API token revoked'), ('team.created', 'Team created'), ('team.deleted', 'Team deleted'), ('membership.set', 'Team role given'), ('membership.removed', 'Team role taken away')], max_length=40)),
                ('actor_label', models.CharField(blank=True, max_length=150)),
                ('object_type', models.CharField(max_length=40)),
                ('object_id', models.CharField(max_length=64)),
                ('data', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField(auto_now_add=True, db_index=True)),
                ('actor', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('model', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='audit_events', to='registry.registeredmodel')),
            ],
            options={
                'db_table': 'registry_auditevent',
                'ordering': ['-created_at', '-id'],
            },
        )], database_operations=[]),
    ]
