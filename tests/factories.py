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


def api_client_for(user):
    """A DRF ``APIClient`` sending a new API token of ``user`` (every scope it may hold) as a bearer
    token, as CI would; an anonymous client for None."""
    from rest_framework.test import APIClient

    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(user)}")
    return client


def team_member(user, role: str = "owner", team=None):
    """Give ``user`` ``role`` (an ``accounts.choices.Role`` value) in ``team`` (default: the default team,
    where models created without a team go); returns the user."""
    from accounts.services import default_team, set_membership

    set_membership(team=team or default_team(), user=user, role=role)
    return user


def page_with_panels(client, url: str) -> str:
    """The HTML of the page at ``url`` followed by that of every panel it loads with htmx as it opens
    (``hx-get`` with an ``hx-trigger`` starting ``load``), as a browser shows it. Fails unless the
    page and each panel answer 200."""
    import html as html_module
    import re

    answer = client.get(url)
    assert answer.status_code == 200, (url, answer.status_code)
    page = answer.content.decode()
    parts = [page]
    for panel in re.findall(r'hx-get="([^"]+)"[^>]*hx-trigger="load', page):
        loaded = client.get(html_module.unescape(panel))
        assert loaded.status_code == 200, (panel, loaded.status_code)
        parts.append(loaded.content.decode())
    return "\n".join(parts)


def profiled(version, host, rows: list[dict], *, slo_p99_ms: float | None = None, sweep="quick",
             status: str = "succeeded"):
    """A profile of ``version`` (ModelVersion) on ``host`` (a ServingHost whose agent reported, protocol 3
    or newer), started through ``start_profile`` and ended by the reports its agent would send: a
    ``running`` report, then ``status`` with ``rows`` (``contract.ProfileRow`` dicts). Returns the Profile,
    read back. Its dispatch to the agent waits for a commit, which a test's transaction never makes."""
    from deployments.models import Profile
    from deployments.profiles import record_profile_report, start_profile

    profile = start_profile(model_name=version.model.name, version=version.version, host_name=host.name,
                            sweep=sweep, slo_p99_ms=slo_p99_ms)
    assert record_profile_report(profile.pk, {"status": "running", "rows": [], "step": "config 1"})
    assert record_profile_report(profile.pk, {"status": status, "rows": rows})
    return Profile.objects.get(pk=profile.pk)
