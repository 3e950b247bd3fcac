"""``manage.py bootstrap_local``: the local stack's first user and API token, idempotently."""

import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from registry.storage import ArtifactStore


class Command(BaseCommand):
    help = (
        "Create the local superuser with a random password (kept in --password-file) unless it exists, "
        "write its API token to --token-file and make sure the artifact bucket exists."
    )

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")
        parser.add_argument("--password-file", type=Path, required=True)
        parser.add_argument("--token-file", type=Path, required=True)
        parser.add_argument("--skip-bucket", action="store_true", help="do not create the S3 bucket")

    def handle(self, *args, username: str, password_file: Path, token_file: Path, skip_bucket: bool, **options):
        users = get_user_model().objects
        user = users.filter(username=username).first()
        if user is None or not password_file.exists():
            password = secrets.token_urlsafe(12)
            if user is None:
                user = users.create_superuser(username=username, email="", password=password)
            else:
                user.set_password(password)
                user.save(update_fields=["password"])
            password_file.parent.mkdir(parents=True, exist_ok=True)
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        token, _ = Token.objects.get_or_create(user=user)
        token_file.parent.mkdir(parents=True, exist_ok=True)
        token_file.write_text(token.key + "\n")
        token_file.chmod(0o600)
        if not skip_bucket:
            ArtifactStore().ensure_bucket()
        self.stdout.write(f"user {username}: password in {password_file}, API token in {token_file}")
