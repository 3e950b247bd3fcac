"""``manage.py create_api_token <username>``: make a new API token for a user and print it once."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from accounts.choices import Scope
from accounts.services import get_team
from accounts.tokens import DEFAULT_EXPIRY_DAYS, default_scopes, issue_token
from modelyard.errors import DomainError


class Command(BaseCommand):
    help = (
        "Make a new API token for USERNAME and print it (only its digest is stored, so this is the one "
        "chance to copy it). Send it as 'Authorization: Bearer <token>'. Default scopes: read, write, "
        f"deploy, plus admin for an administrator; it expires in {DEFAULT_EXPIRY_DAYS} days unless told otherwise. "
        "Existing tokens stay valid."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="a label for the token (default: cli)")
        parser.add_argument("--scope", action="append", dest="scopes", choices=Scope.values, metavar="SCOPE",
                            help=f"repeat for each scope ({', '.join(Scope.values)}); default: every scope "
                                 "the user may hold")
        parser.add_argument("--team", help="limit the token to this team's models")
        lifetime = parser.add_mutually_exclusive_group()
        lifetime.add_argument("--expires-in-days", type=int, metavar="N", default=DEFAULT_EXPIRY_DAYS,
                              help=f"expire N days from now (default: {DEFAULT_EXPIRY_DAYS})")
        lifetime.add_argument("--no-expiry", action="store_true", help="a token that never expires")

    def handle(self, *args, username: str, name: str, scopes: list[str] | None, team: str | None,
               expires_in_days: int, no_expiry: bool, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}; create one with 'manage.py createsuperuser'")
        if expires_in_days < 1:
            raise CommandError("--expires-in-days must be at least 1")
        expires_at = None if no_expiry else timezone.now() + timedelta(days=expires_in_days)
        try:
            _token, plaintext = issue_token(
                user=user, name=name, scopes=scopes or default_scopes(user),
                team=get_team(team) if team else None, expires_at=expires_at)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(plaintext)
