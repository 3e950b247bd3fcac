"""``manage.py create_api_token <username>``: print a new API token for a user."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Create (or replace) the API token of USERNAME and print it. Use it as 'Authorization: Token <key>'."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, *args, username: str, **options):
        try:
            user = get_user_model().objects.get(username=username)
        except get_user_model().DoesNotExist as exc:
            raise CommandError(f"no user named {username!r}; create one with 'manage.py createsuperuser'") from exc
        Token.objects.filter(user=user).delete()
        token = Token.objects.create(user=user)
        self.stdout.write(token.key)
