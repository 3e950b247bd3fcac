"""API tokens: issue, install, look up, mark used and revoke; only a SHA-256 digest is ever stored.

A token reads ``my_<prefix>_<secret>``: ``prefix`` is 12 lower-case hex characters (48 random bits,
not secret) that finds the row, ``secret`` is ``secrets.token_urlsafe(32)`` (256 random bits, 43
characters). The row keeps ``prefix`` and the hex SHA-256 of the whole token; the plaintext is
returned once by :func:`issue_token` and cannot be recovered afterwards. A stored digest is compared
with ``hmac.compare_digest`` so the comparison takes the same time wherever the digests differ.

SHA-256 without salt or stretching is enough here (as for GitHub's and PyPI's tokens): the secret
is 256 random bits, not a password, so a dictionary attack on a leaked digest cannot succeed.
"""

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts.choices import Scope
from accounts.models import ApiToken, Membership, Team
from accounts.token_lookup import token_by_prefix
from audit.choices import AuditAction
from audit.services import record_audit_event
from modelyard.errors import Conflict, DomainError, Forbidden, InvalidInput, NotFound

TOKEN_PREFIX = "my"
PREFIX_HEX_CHARS = 12
SECRET_BYTES = 32
# The token grammar; an installed token (made outside, see install_token) must follow it too. A
# secret of at least 43 URL-safe characters carries >= 256 bits when drawn at random (base64) and
# >= 172 bits when hex; the recipe in the docs draws 64 hex characters (256 bits).
TOKEN_RE = re.compile(r"my_(?P<prefix>[a-z0-9]{8,16})_(?P<secret>[A-Za-z0-9_-]{43,256})")
LAST_USED_RESOLUTION = timedelta(seconds=60)
NAME_MAX_LENGTH = ApiToken._meta.get_field("name").max_length
DEFAULT_EXPIRY_DAYS = 90  # a new token's life when its maker names none (the form and the API)
SCOPE_ORDER = {scope: index for index, scope in enumerate(Scope.values)}


class TokenRejected(DomainError):
    """A presented token cannot be used (unknown, revoked, expired, inactive user): HTTP 401."""

    status_code = 401
    code = "authentication_failed"


def token_digest(plaintext: str) -> str:
    """Hex SHA-256 (FIPS 180-4) of the whole token's (or inference key's) UTF-8 bytes: 64 lower-case characters."""
    return hashlib.sha256(plaintext.encode()).hexdigest()


def new_plaintext(kind: str = TOKEN_PREFIX) -> tuple[str, str]:
    """A new random secret ``<kind>_<prefix>_<secret>`` and its prefix, as API tokens (and inference keys,
    ``registry.inference_keys``) are made.

    Args:
        kind: what the secret is, its first characters (``my`` for API tokens).

    Returns:
        ``(prefix, plaintext)``: ``prefix`` 12 lower-case hex characters (48 random bits, not secret) to
        find the row, ``plaintext`` the whole secret (256 random bits after the prefix); store only
        :func:`token_digest` of it.
    """
    prefix = secrets.token_hex(PREFIX_HEX_CHARS // 2)
    return prefix, f"{kind}_{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}"


def clean_scopes(scopes) -> list[str]:
    """``scopes`` checked and put in the order of :class:`Scope`, each once.

    Raises:
        InvalidInput: not a non-empty list of Scope values.
    """
    if isinstance(scopes, str) or not isinstance(scopes, list | tuple | set | frozenset):
        raise InvalidInput("scopes must be a list of scope names")
    unknown = [s for s in scopes if s not in SCOPE_ORDER]
    if unknown:
        raise InvalidInput(f"unknown scope {unknown[0]!r}: choose from {', '.join(Scope.values)}")
    if not scopes:
        raise InvalidInput(f"give at least one scope ({', '.join(Scope.values)})")
    return sorted(set(scopes), key=SCOPE_ORDER.__getitem__)


def find_team(user, name: str) -> Team:
    """The team called ``name``, for a token of ``user``.

    Raises:
        Forbidden: ``user`` is not a member of such a team (HTTP 403); said the same way whether the
            team exists or not, so team names do not leak to outsiders.
        NotFound: no such team, for an administrator (HTTP 404).
    """
    team = Team.objects.filter(name=name).first()
    if user.is_staff:
        if team is None:
            raise NotFound(f"team {name!r} does not exist")
        return team
    if team is None or not Membership.objects.filter(user=user, team=team).exists():
        raise Forbidden(f"{user.get_username()!r} is not a member of team {name!r}")
    return team


def _check_grant(*, user, name: str, scopes, team: Team | None, expires_at: datetime | None,
                 via: ApiToken | None) -> tuple[str, list[str], datetime | None]:
    """The checks shared by issue_token and install_token; returns (name, scopes, expires_at) cleaned."""
    name = (name or "").strip()
    if not name or len(name) > NAME_MAX_LENGTH:
        raise InvalidInput(f"a token needs a name of 1 to {NAME_MAX_LENGTH} characters")
    scopes = clean_scopes(scopes)
    if not user.is_active:
        raise InvalidInput(f"user {user.get_username()!r} is inactive")
    if Scope.ADMIN in scopes and not user.is_staff:
        raise Forbidden("only administrators may hold a token with the 'admin' scope")
    if team is not None and not user.is_staff and not Membership.objects.filter(user=user, team=team).exists():
        raise Forbidden(f"{user.get_username()!r} is not a member of team {team.name!r}")
    if via is not None:
        # A token may only make a token that can do no more than itself: no scope it lacks, no other
        # team, no longer life.
        missing = [s for s in scopes if s not in via.scopes]
        if missing:
            raise Forbidden(f"this API token lacks the '{missing[0]}' scope, so it cannot grant it")
        if via.team_id is not None and (team is None or team.pk != via.team_id):
            raise Forbidden(f"this API token is limited to team '{via.team.name}'; so must be the tokens it makes")
        if via.expires_at is not None:
            if expires_at is None:
                expires_at = via.expires_at
            elif expires_at > via.expires_at:
                raise Forbidden(f"this API token expires at {via.expires_at.isoformat()}; "
                                "the tokens it makes cannot outlive it")
    if expires_at is not None:
        if timezone.is_naive(expires_at):
            raise InvalidInput("expires_at needs a time zone")
        if expires_at <= timezone.now():
            raise InvalidInput("expires_at must be in the future")
    return name, scopes, expires_at


def default_expiry(via: ApiToken | None = None) -> datetime:
    """When a new token expires if its maker names no time: ``DEFAULT_EXPIRY_DAYS`` from now, or
    ``via``'s expiry when that comes sooner (a token cannot outlive the token that made it)."""
    expires_at = timezone.now() + timedelta(days=DEFAULT_EXPIRY_DAYS)
    if via is not None and via.expires_at is not None:
        return min(expires_at, via.expires_at)
    return expires_at


def _audit(action: str, token: ApiToken, actor) -> None:
    record_audit_event(action=action, actor=actor, obj_type="token", obj_id=token.pk, data={
        "name": token.name, "prefix": token.prefix, "user": token.user.get_username(), "scopes": token.scopes,
        "team": token.team.name if token.team_id else None,
        "expires_at": token.expires_at.isoformat() if token.expires_at else None,
    })


def issue_token(*, user, name: str, scopes, team: Team | None = None, expires_at: datetime | None = None,
                actor=None, via: ApiToken | None = None) -> tuple[ApiToken, str]:
    """Make a new API token for ``user`` and return it with its plaintext, which is not kept.

    Args:
        user: who the token acts as; must be active.
        name: a label of 1 to 100 characters ("ci", "laptop").
        scopes: a non-empty list of :class:`Scope` values; ``admin`` only for staff users.
        team: limits the token to this team's models; ``user`` must be a member unless staff.
        expires_at: an aware datetime in the future, or None for no expiry (or, with ``via``, the
            expiry of ``via``).
        actor: who asks, for the audit trail (default ``user``).
        via: the token the request asking for this one authenticated with, if any: the new token
            may then carry only scopes ``via`` has, must keep ``via``'s team limit, and cannot
            expire later than ``via``.

    Returns:
        ``(ApiToken, plaintext)``; show the plaintext once, it is stored only as a digest.

    Raises:
        InvalidInput: bad name, scopes or expiry, or an inactive user (HTTP 400).
        Forbidden: ``admin`` for a non-staff user, a team the user is not in, or more than ``via``
            allows (HTTP 403).
    """
    name, scopes, expires_at = _check_grant(user=user, name=name, scopes=scopes, team=team,
                                            expires_at=expires_at, via=via)
    for _attempt in range(5):  # a prefix collision (48 bits) is rare; draw again
        prefix, plaintext = new_plaintext()
        try:
            with transaction.atomic():
                token = ApiToken.objects.create(user=user, name=name, prefix=prefix, digest=token_digest(plaintext),
                                                scopes=scopes, team=team, expires_at=expires_at)
                _audit(AuditAction.TOKEN_CREATED, token, actor or user)
        except IntegrityError:
            continue
        return token, plaintext
    raise Conflict("could not draw an unused token prefix; try again")


def install_token(*, user, name: str, plaintext: str, scopes, team: Team | None = None,
                  expires_at: datetime | None = None, replace: bool = False, actor=None) -> ApiToken:
    """Store a token made outside (a deployment secret), by digest, for ``user``; idempotent.

    The plaintext must follow the token grammar ``my_<prefix>_<secret>`` (prefix 8 to 16 of
    ``[a-z0-9]``, secret at least 43 of ``[A-Za-z0-9_-]``), e.g. from
    ``printf 'my_%s_%s\\n' "$(openssl rand -hex 6)" "$(openssl rand -hex 32)"``.

    Args:
        user, name, scopes, team, expires_at, actor: as for :func:`issue_token`.
        plaintext: the token.
        replace: also revoke ``user``'s other usable tokens called ``name`` (a changed secret
            replaces the old one).

    Returns:
        The ApiToken row: the existing one when this very token is already installed for ``user``
        (its scopes, team and expiry then stay as they are), else a new one.

    Raises:
        InvalidInput: the plaintext does not follow the grammar, or as :func:`issue_token`.
        Conflict: the prefix belongs to another token (HTTP 409).
        Forbidden: as :func:`issue_token`.
    """
    plaintext = (plaintext or "").strip()
    match = TOKEN_RE.fullmatch(plaintext)
    if match is None:
        raise InvalidInput("a token must read my_<prefix>_<secret>: prefix 8-16 of [a-z0-9], secret at least 43 "
                           "of [A-Za-z0-9_-]; make one with: printf 'my_%s_%s\\n' \"$(openssl rand -hex 6)\" "
                           "\"$(openssl rand -hex 32)\"")
    name, scopes, expires_at = _check_grant(user=user, name=name, scopes=scopes, team=team,
                                            expires_at=expires_at, via=None)
    digest = token_digest(plaintext)
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().filter(prefix=match["prefix"]).first()
        if token is not None and not (token.user_id == user.pk and hmac.compare_digest(token.digest, digest)):
            raise Conflict(f"another token already uses the prefix {match['prefix']!r}; make a new token")
        if token is None:
            token = ApiToken.objects.create(user=user, name=name, prefix=match["prefix"], digest=digest, scopes=scopes,
                                            team=team, expires_at=expires_at)
            _audit(AuditAction.TOKEN_CREATED, token, actor or user)
        if replace:
            for old in ApiToken.objects.usable().filter(user=user, name=name).exclude(pk=token.pk):
                revoke_token(old, actor or user)
    return token


def authenticate_token(plaintext: str) -> ApiToken:
    """The usable token whose plaintext is ``plaintext``, with its user and team loaded. One query
    (``accounts.token_lookup``).

    Raises:
        TokenRejected: (HTTP 401) with a sentence saying why: not a Modelyard token, unknown,
            revoked, expired, or its user is inactive. Revocation and expiry are told only to a
            caller holding the whole token (its digest matched).
    """
    match = TOKEN_RE.fullmatch(plaintext or "")
    if match is None:
        raise TokenRejected("invalid API token: Modelyard tokens read my_<prefix>_<secret>")
    token = token_by_prefix(match["prefix"])
    if token is None or not hmac.compare_digest(token.digest, token_digest(plaintext)):
        raise TokenRejected("unknown API token")
    if token.revoked_at is not None:
        raise TokenRejected(f"this API token ({token.name}, my_{token.prefix}…) was revoked at "
                            f"{token.revoked_at.isoformat(timespec='seconds')}")
    if token.expires_at is not None and token.expires_at <= timezone.now():
        raise TokenRejected(f"this API token ({token.name}, my_{token.prefix}…) expired at "
                            f"{token.expires_at.isoformat(timespec='seconds')}")
    if not token.user.is_active:
        raise TokenRejected(f"the user of this API token ({token.user.get_username()}) is inactive")
    return token


def mark_used(token: ApiToken, now: datetime | None = None) -> bool:
    """Record that ``token`` was just used, at most once per 60 s.

    When the loaded ``last_used_at`` is less than 60 s old nothing is queried; otherwise one
    ``UPDATE ... WHERE last_used_at IS NULL OR last_used_at < now - 60 s``, so concurrent requests
    write it once.

    Returns:
        True when this call wrote ``last_used_at``.
    """
    now = now or timezone.now()
    cutoff = now - LAST_USED_RESOLUTION
    if token.last_used_at is not None and token.last_used_at >= cutoff:
        return False
    updated = ApiToken.objects.filter(pk=token.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=cutoff)).update(last_used_at=now)
    if updated:
        token.last_used_at = now
    return bool(updated)


def revoke_token(token: ApiToken, actor) -> ApiToken:
    """Revoke ``token`` now; the row stays for the audit trail. Idempotent (a repeat changes nothing).

    Args:
        token: the token to revoke.
        actor: who asks: the token's user or an administrator (``is_staff``); None for the system.

    Returns:
        The token, with ``revoked_at`` set (to the first revocation's time on a repeat).

    Raises:
        Forbidden: ``actor`` is neither the token's user nor an administrator (HTTP 403).
    """
    if actor is not None and actor.pk != token.user_id and not actor.is_staff:
        raise Forbidden("only the token's user or an administrator may revoke it")
    now = timezone.now()
    with transaction.atomic():
        if ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now):
            token.revoked_at = now
            _audit(AuditAction.TOKEN_REVOKED, token, actor)
        else:
            token.refresh_from_db(fields=["revoked_at"])
    return token


def token_state(token: ApiToken, now: datetime | None = None) -> str:
    """``"revoked"``, ``"expired"`` or ``"active"``."""
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= (now or timezone.now()):
        return "expired"
    return "active"


def default_scopes(user) -> list[str]:
    """Every scope ``user`` may hold: read, write, deploy, plus admin for staff."""
    return [s for s in Scope.values if s != Scope.ADMIN or user.is_staff]
