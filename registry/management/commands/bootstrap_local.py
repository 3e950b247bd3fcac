"""``manage.py bootstrap_local``: the local stack's first user and API token, idempotently."""

import os
import secrets
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from accounts.models import ApiToken
from accounts.tokens import TokenRejected, authenticate_token, default_scopes, issue_token, revoke_token
from registry.storage import ArtifactStore

TOKEN_NAME = "bootstrap_local"


def _token_still_works(token_file: Path, user) -> bool:
    """True when ``token_file`` holds a usable API token of ``user``."""
    if not token_file.is_file():
        return False
    try:
        return authenticate_token(token_file.read_text().strip()).user_id == user.pk
    except TokenRejected:
        return False


class Command(BaseCommand):
    help = (
        "Create the local superuser with a random password (kept in --password-file) unless it exists, "
        "write a new API token of it to --token-file unless the file holds one that still works, and make "
        "sure the artifact bucket exists."
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
        if not _token_still_works(token_file, user):
            # The earlier local tokens' secrets are lost with their file: revoke them, make a new one.
            for lost in ApiToken.objects.usable().filter(user=user, name=TOKEN_NAME):
                revoke_token(lost, None)
            _token, plaintext = issue_token(user=user, name=TOKEN_NAME, scopes=default_scopes(user))
            token_file.parent.mkdir(parents=True, exist_ok=True)
            partial = token_file.with_name(token_file.name + ".tmp")
            partial.unlink(missing_ok=True)
            with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
                fh.write(plaintext + "\n")
            partial.replace(token_file)
        if not skip_bucket:
            ArtifactStore().ensure_bucket()
        self.stdout.write(f"user {username}: password in {password_file}, API token in {token_file}")
