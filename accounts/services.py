"""Team operations: the default team, finding a team by name, memberships."""

from django.conf import settings
from django.db import transaction

from accounts.choices import Role
from accounts.models import ApiToken, Membership, Team
from audit.choices import AuditAction
from audit.services import record_audit_event
from modelyard.errors import Conflict, InvalidInput, NotFound
from modelyard_agent.formats.names import InvalidName, validate_name


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


def set_membership(*, team: Team, user, role: str, actor=None) -> Membership:
    """Give ``user`` ``role`` in ``team`` (creating or changing the membership). Idempotent; a change
    is an audit event (``membership.set`` with the role before and after).

    Args:
        team: the team.
        user: the member.
        role: a ``Role`` value.
        actor: who changes it (None: the system, e.g. a test or a management command).

    Raises:
        InvalidInput: ``role`` is not a Role value.
    """
    if role not in Role.values:
        raise InvalidInput(f"role must be one of {', '.join(Role.values)}")
    with transaction.atomic():
        before = Membership.objects.filter(team=team, user=user).values_list("role", flat=True).first()
        membership, _ = Membership.objects.update_or_create(team=team, user=user, defaults={"role": role})
        if before != role:
            record_audit_event(action=AuditAction.MEMBERSHIP_SET, actor=actor, obj_type="team", obj_id=team.pk,
                               data={"team": team.name, "user": user.username, "from": before, "to": role})
    return membership


def remove_membership(*, team: Team, user, actor=None) -> None:
    """Take ``user``'s role in ``team`` away; audited as ``membership.removed``.

    Raises:
        NotFound: the user is not a member.
    """
    with transaction.atomic():
        membership = Membership.objects.select_for_update().filter(team=team, user=user).first()
        if membership is None:
            raise NotFound(f"{user.username} is not a member of {team.name}")
        record_audit_event(action=AuditAction.MEMBERSHIP_REMOVED, actor=actor, obj_type="team", obj_id=team.pk,
                           data={"team": team.name, "user": user.username, "from": membership.role, "to": None})
        membership.delete()


def create_team(*, name: str, description: str = "", actor=None) -> Team:
    """Create a team; audited as ``team.created``.

    Args:
        name: checked against the model-name grammar (``modelyard_agent.formats.names``): lower case,
            digits, ``-``, ``_``.

    Raises:
        InvalidInput: a bad name.
        Conflict: the name is taken.
    """
    try:
        clean = validate_name(name, kind="team name")
    except InvalidName as exc:
        raise InvalidInput(str(exc)) from exc
    with transaction.atomic():
        if Team.objects.filter(name=clean).exists():
            raise Conflict(f"a team named {clean!r} already exists")
        team = Team.objects.create(name=clean, description=description or "")
        record_audit_event(action=AuditAction.TEAM_CREATED, actor=actor, obj_type="team", obj_id=team.pk,
                           data={"team": team.name})
    return team


def delete_team(*, team: Team, actor=None) -> None:
    """Delete a team with its memberships; audited as ``team.deleted``.

    Tokens limited to the team that can no longer be used (revoked or expired) go with it (their
    creation and revocation stay in the audit log); a usable one blocks the deletion, so no CI job
    loses its access silently.

    Raises:
        Conflict: the team owns models, or usable API tokens are limited to it (HTTP 409).
    """
    with transaction.atomic():
        team = Team.objects.select_for_update().get(pk=team.pk)
        models = team.models.count()
        if models:
            raise Conflict(f"team {team.name!r} owns {models} model(s); move or delete them first")
        usable = ApiToken.objects.usable().filter(team=team).count()
        if usable:
            raise Conflict(f"{usable} usable API token(s) are limited to team {team.name!r}; revoke them first")
        ApiToken.objects.filter(team=team).delete()
        record_audit_event(action=AuditAction.TEAM_DELETED, actor=actor, obj_type="team", obj_id=team.pk,
                           data={"team": team.name,
                                 "members": dict(team.memberships.values_list("user__username", "role"))})
        team.delete()
