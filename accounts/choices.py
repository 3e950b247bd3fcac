"""Roles of team members and scopes of API tokens."""

from django.db import models


class Role(models.TextChoices):
    """A member's role in a team, each one including the rights of those before it.

    - viewer: read the team's models, versions, deployments, metrics and audit events;
    - maintainer: also register versions, edit models, move non-production aliases, deploy to
      non-production hosts, run promotion policies and "Try it";
    - owner: also move production aliases, deploy to production hosts, delete any version of
      the team's models, and manage the team's promotion policies and approvals.

    Administrators (``User.is_staff``) hold the owner role in every team and, beyond it, manage
    serving hosts, users, teams and webhooks.
    """

    VIEWER = "viewer", "viewer"
    MAINTAINER = "maintainer", "maintainer"
    OWNER = "owner", "owner"

    @classmethod
    def rank(cls, role: str | None) -> int:
        """Order of ``role``: 0 for no role, then 1 viewer, 2 maintainer, 3 owner."""
        return {cls.VIEWER: 1, cls.MAINTAINER: 2, cls.OWNER: 3}.get(role, 0)


class Scope(models.TextChoices):
    """What an API token may be used for, on top of its user's roles.

    - read: every ``GET``;
    - write: register models and versions, edit them, move aliases, delete versions, run and
      approve promotion policies;
    - deploy: start and control rollouts, unload and reload models on hosts, "Try it";
    - admin: serving hosts, teams, webhooks (only for an administrator's token).

    Every scope includes ``read``.
    """

    READ = "read", "read"
    WRITE = "write", "write"
    DEPLOY = "deploy", "deploy"
    ADMIN = "admin", "admin"
