"""Test data made through the services, as the app makes it."""

from accounts.tokens import default_scopes, issue_token


def token_for(user, scopes=None, *, team=None, expires_at=None, name: str = "test") -> str:
    """A new API token of ``user`` (plaintext, for ``Authorization: Bearer <token>``).

    Args:
        user: the token's user.
        scopes: list of ``accounts.choices.Scope`` values; default every scope the user may hold
            (read, write, deploy, plus admin for staff), as ``manage.py create_api_token`` gives.
        team: limit the token to this Team.
        expires_at: an aware datetime in the future, or None.
        name: the token's label.
    """
    _token, plaintext = issue_token(user=user, name=name, scopes=scopes or default_scopes(user), team=team,
                                    expires_at=expires_at)
    return plaintext


def team_member(user, role: str = "owner", team=None):
    """Give ``user`` ``role`` (an ``accounts.choices.Role`` value) in ``team`` (default: the default team,
    where models created without a team go); returns the user."""
    from accounts.services import default_team, set_membership

    set_membership(team=team or default_team(), user=user, role=role)
    return user
