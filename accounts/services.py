"""Team operations: the default team, finding a team by name, memberships."""

from django.conf import settings
from django.db import transaction

from accounts.choices import Role
from accounts.models import Membership, Team
from modelyard.errors import InvalidInput, NotFound


def default_team() -> Team:
    """The site's default team (``MODELYARD_DEFAULT_TEAM``, default ``default``), created on first use.

    Models registered without naming a team by an administrator, a management command or a
    worker go here. Idempotent.
    """
    team, _ = Team.objects.get_or_create(name=settings.MODELYARD_DEFAULT_TEAM)
    return team


def default_team_id() -> int:
    """Primary key of :func:`default_team`; the default of ``RegisteredModel.team``."""
    return default_team().pk


def get_team(name: str) -> Team:
    """The team called ``name``.

    Raises:
        NotFound: no such team (HTTP 404).
    """
    team = Team.objects.filter(name=name).first()
    if team is None:
        raise NotFound(f"team {name!r} does not exist")
    return team


def set_membership(*, team: Team, user, role: str) -> Membership:
    """Give ``user`` ``role`` in ``team`` (creating or changing the membership). Idempotent.

    Raises:
        InvalidInput: ``role`` is not a Role value.
    """
    if role not in Role.values:
        raise InvalidInput(f"role must be one of {', '.join(Role.values)}")
    with transaction.atomic():
        membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
    return membership
