"""Who may do what: the one place pages, the API (and so the CLI) and the admin ask.

A request acts as a :class:`Principal`: a user and, for API calls, the token used. Rights are the
user's role in the model's team (``accounts.choices.Role``; administrators are owners of every
team) narrowed by the token: its scopes (``accounts.choices.Scope``) and, when set, its team.

What each action needs (role in the model's team, token scope):

==========================  ==============================================  ========
action                      role                                            scope
==========================  ==============================================  ========
``VIEW``                    viewer                                          read
``CHANGE``                  maintainer (register, edit, upload)             write
``MOVE_ALIAS``              maintainer; owner for a production or protected write
                            alias (which also needs a reason)
``PROTECT_ALIAS``           owner (lock or unlock an alias)                 write
``DELETE_VERSION``          owner, or the maintainer who registered it      write
``DEPLOY``                  maintainer; owner when any host is production   deploy
``RUN_POLICY``              maintainer                                      write
``MANAGE_POLICY``           owner (create, edit, pause, approve, reject)    write
``MANAGE_CAPTURE``          owner (request capture settings: users' data)   write
``CREATE_MODEL``            maintainer of the team it goes to               write
``MANAGE_WEBHOOKS``         owner (a webhook of the team; the view asks     read
                            ``write`` to change one)
``READ_CAPTURED``           owner (what replays show of captured requests:  read
                            the worst disagreements' answers)
``MANAGE_INFERENCE_KEYS``   owner (create or revoke the team's inference    write
                            keys; require one to call a model)
``ADMIN``                   administrator (hosts, teams, users, webhooks    admin
                            of every team)
==========================  ==============================================  ========

A model of a team the principal cannot see answers exactly like a model that does not exist
(404 with the same message), so names do not leak across teams.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from functools import cache

from django.conf import settings
from django.db.models import QuerySet
from django.db.models.expressions import RawSQL

from accounts.choices import Role, Scope
from accounts.models import ApiToken, Membership, Team
from accounts.services import default_team
from modelyard.errors import Forbidden, InvalidInput


class Action(Enum):
    """Something a principal may be allowed to do: (name, least role, token scope); see the module's table."""

    VIEW = ("view", Role.VIEWER, Scope.READ)
    CHANGE = ("change", Role.MAINTAINER, Scope.WRITE)
    MOVE_ALIAS = ("move_alias", Role.MAINTAINER, Scope.WRITE)
    PROTECT_ALIAS = ("protect_alias", Role.OWNER, Scope.WRITE)
    DELETE_VERSION = ("delete_version", Role.MAINTAINER, Scope.WRITE)
    DEPLOY = ("deploy", Role.MAINTAINER, Scope.DEPLOY)
    RUN_POLICY = ("run_policy", Role.MAINTAINER, Scope.WRITE)
    MANAGE_POLICY = ("manage_policy", Role.OWNER, Scope.WRITE)
    MANAGE_CAPTURE = ("manage_capture", Role.OWNER, Scope.WRITE)
    CREATE_MODEL = ("create_model", Role.MAINTAINER, Scope.WRITE)
    MANAGE_WEBHOOKS = ("manage_webhooks", Role.OWNER, Scope.READ)
    READ_CAPTURED = ("read_captured", Role.OWNER, Scope.READ)
    MANAGE_INFERENCE_KEYS = ("manage_inference_keys", Role.OWNER, Scope.WRITE)
    ADMIN = ("admin", None, Scope.ADMIN)

    @property
    def role(self) -> str | None:
        """The least role in the model's team (None for ``ADMIN``, which needs an administrator)."""
        return self.value[1]

    @property
    def scope(self) -> str:
        """The token scope the action needs."""
        return self.value[2]


def production_aliases() -> frozenset[str]:
    """Alias names only a team's owners may move (``MODELYARD_PRODUCTION_ALIASES``, default ``production``)."""
    return frozenset(settings.MODELYARD_PRODUCTION_ALIASES)


@dataclass
class Principal:
    """Who acts: a signed-in user and the API token used, if any.

    Attributes:
        user: the Django user (``is_staff`` marks an administrator).
        token: the ``ApiToken`` the request authenticated with; None for a browser session,
            a management command or a worker acting for the user.
    """

    user: object
    token: ApiToken | None = None
    _roles: dict = field(default_factory=dict, repr=False, compare=False)
    # What ``registry.access.visible_model_names`` found for this principal, once looked up.
    visible_names_cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, request_or_user) -> "Principal":
        """The principal of a Django/DRF request (its user and ``request.auth``), or of a bare user.

        A request's principal is made once and kept on the request, so the roles it looks up are
        cached for the rest of the request (one query per team however many checks a page makes).
        """
        if isinstance(request_or_user, Principal):
            return request_or_user
        user = getattr(request_or_user, "user", None)
        if user is None or not hasattr(request_or_user, "method"):
            return cls(user=request_or_user)
        token = getattr(request_or_user, "auth", None)
        token = token if isinstance(token, ApiToken) else None
        cached = getattr(request_or_user, "_modelyard_principal", None)
        if cached is not None and cached.user is user and cached.token is token:
            return cached
        principal = cls(user=user, token=token)
        request_or_user._modelyard_principal = principal
        return principal

    @property
    def is_authenticated(self) -> bool:
        return bool(getattr(self.user, "is_authenticated", False))

    @property
    def is_admin(self) -> bool:
        """An administrator acting with full rights (a token limited to a team or without ``admin``
        scope acts as an owner of the teams it reaches, not as an administrator)."""
        if not (self.is_authenticated and self.user.is_staff):
            return False
        return self.token is None or (self.token.allows(Scope.ADMIN) and self.token.team_id is None)

    @property
    def team_limit(self) -> int | None:
        """The id of the only team the token reaches, or None."""
        return self.token.team_id if self.token is not None else None

    def allows_scope(self, scope: str) -> bool:
        """True when the token (if any) carries ``scope``."""
        return self.token is None or self.token.allows(scope)

    def role_in(self, team_id: int) -> str | None:
        """The principal's role in team ``team_id``: owner for administrators, else the membership's
        role, None without one or outside the token's team."""
        if not self.is_authenticated:
            return None
        if self.team_limit is not None and self.team_limit != team_id:
            return None
        if self.user.is_staff:
            return Role.OWNER
        if team_id not in self._roles:
            self._roles[team_id] = (
                Membership.objects.filter(user=self.user, team_id=team_id).values_list("role", flat=True).first()
            )
        return self._roles[team_id]

    def note_role(self, team_id: int, role: str | None) -> None:
        """Record the principal's membership role in team ``team_id`` (None: not a member) as a query that
        joined the membership read it, so ``role_in`` asks the database no more for that team."""
        self._roles[team_id] = role

    def team_ids(self, minimum: str = Role.VIEWER) -> QuerySet | RawSQL | None:
        """Ids of the teams where the principal holds at least role ``minimum``, as a subquery for an ``__in``
        lookup (``team__in=...``); None means every team (an administrator without a team-limited token).

        A member's is one prebuilt statement (``_membership_team_ids``): the ORM took longer to build and compile
        the same subquery into every page's query than PostgreSQL takes to run it."""
        if self.is_authenticated and self.user.is_staff and self.team_limit is None:
            return None
        if not self.is_authenticated:
            return Membership.objects.none().values("team_id")
        if self.team_limit is not None and self.user.is_staff:
            return Team.objects.filter(pk=self.team_limit).values("pk")
        roles = [role for role in Role.values if Role.rank(role) >= Role.rank(minimum)]
        limited = self.team_limit is not None
        return RawSQL(_membership_team_ids(len(roles), limited),
                      (self.user.pk, *roles, *([self.team_limit] if limited else [])))


@cache
def _membership_team_ids(roles: int, limited: bool) -> str:
    """SQL of the team ids of a user's memberships with one of ``roles`` roles (parameters: the user's id, the
    roles, then the token's one team where ``limited``)."""
    table, user, team, role = (Membership._meta.db_table, *(Membership._meta.get_field(name).column
                                                             for name in ("user", "team", "role")))
    limit = f' AND "{team}" = %s' if limited else ""
    return (f'SELECT "{team}" FROM "{table}" WHERE "{user}" = %s AND "{role}" IN ({", ".join(["%s"] * roles)})'
            f"{limit}")


def scope_team_filter(principal: Principal, queryset: QuerySet, team_path: str = "team") -> QuerySet:
    """``queryset`` narrowed to rows whose ``team_path`` is a team the principal can see.

    Args:
        principal: who asks.
        queryset: any queryset; ``team_path`` is the lookup from its rows to a Team
            (``"team"`` for models, ``"model__team"`` for versions, deployments, audit events).

    Returns:
        The narrowed queryset (the same one for an administrator; none for an anonymous principal).
    """
    if not principal.is_authenticated or not principal.allows_scope(Scope.READ):
        return queryset.none()
    team_ids = principal.team_ids()
    if team_ids is None:
        return queryset
    return queryset.filter(**{f"{team_path}__in": team_ids})


def can_see(principal: Principal, model) -> bool:
    """True when ``principal`` may read ``model`` (a RegisteredModel)."""
    return principal.allows_scope(Scope.READ) and principal.role_in(model.team_id) is not None


def check(principal: Principal, action: Action, *, model=None, team=None, alias: str | None = None,
          protected: bool = False, hosts: Iterable = (), version=None, doing: str | None = None) -> str | None:
    """Why ``principal`` may not do ``action``, or None when it may.

    Args:
        principal: who acts.
        action: what it wants to do.
        model: the RegisteredModel acted on (its team decides the role), for every action but
            ``ADMIN`` and ``CREATE_MODEL``.
        team: the Team a new model goes to, for ``CREATE_MODEL``; the webhook's team, for ``MANAGE_WEBHOOKS``.
        alias: the alias name, for ``MOVE_ALIAS`` and ``PROTECT_ALIAS`` (production aliases need an owner).
        protected: for ``MOVE_ALIAS``: the alias is protected (locked), so moving it needs an owner.
        hosts: the ServingHosts a rollout or host operation touches, for ``DEPLOY`` (production
            hosts need an owner).
        version: the ModelVersion, for ``DELETE_VERSION`` (its creator may delete it as a maintainer).
        doing: what the refusal calls the act ("unloading a model from a production host"), when the
            action's own name would mislead.

    Returns:
        A sentence saying what is missing, or None.
    """
    if not principal.is_authenticated:
        return "sign in first"
    if not principal.allows_scope(action.scope):
        return f"this API token lacks the '{action.scope}' scope"
    if action is Action.ADMIN:
        return None if principal.is_admin else "only administrators may do this"
    team_id = team.pk if team is not None else model.team_id
    role = principal.role_in(team_id)
    needed = action.role
    if action is Action.MOVE_ALIAS and (protected or alias in production_aliases()):
        needed = Role.OWNER
    if action is Action.DEPLOY and any(getattr(host, "production", False) for host in hosts):
        needed = Role.OWNER
    if action is Action.DELETE_VERSION and not (
        version is not None and version.created_by_id is not None and version.created_by_id == principal.user.pk
    ):
        needed = Role.OWNER
    if Role.rank(role) >= Role.rank(needed):
        return None
    team_name = team.name if team is not None else model.team.name
    what = doing or {
        Action.MOVE_ALIAS: f"moving the {'protected ' if protected else ''}alias '{alias}'",
        Action.PROTECT_ALIAS: f"locking or unlocking the alias '{alias}'",
        Action.MANAGE_WEBHOOKS: "managing the team's webhooks",
        Action.READ_CAPTURED: "reading what replays show of captured requests",
        Action.MANAGE_INFERENCE_KEYS: "managing inference keys",
        Action.MANAGE_CAPTURE: "changing request capture (captured requests hold users' data)",
        Action.DEPLOY: "deploying to production hosts" if needed == Role.OWNER else "deploying",
        Action.DELETE_VERSION: "deleting a version someone else registered",
    }.get(action, "this")
    held = f"you are {role}" if role else "you are not a member"
    return f"{what} needs the {needed} role in team '{team_name}' ({held})"


def require(principal: Principal, action: Action, **context) -> None:
    """Raise ``Forbidden`` (HTTP 403) unless ``principal`` may do ``action``; see :func:`check`.

    Raises:
        Forbidden: with the sentence from :func:`check`.
    """
    reason = check(principal, action, **context)
    if reason is not None:
        raise Forbidden(reason)


def team_for_new_model(principal: Principal, team_name: str = ""):
    """The team a model registered by ``principal`` goes to, once it may create models there.

    Args:
        principal: who registers the model.
        team_name: the team asked for; empty means "the obvious one": the token's team, the
            only team where the principal is a maintainer or owner, or the default team for
            an administrator.

    Returns:
        The Team.

    Raises:
        InvalidInput: no such team, or the principal belongs to several and named none (HTTP 400).
        Forbidden: the principal may not create models in that team (HTTP 403).
    """
    if team_name:
        team = Team.objects.filter(name=team_name).first()
        if team is None:
            raise InvalidInput(f"no team named {team_name!r}")
    elif principal.team_limit is not None:
        team = Team.objects.get(pk=principal.team_limit)
    else:
        ids = principal.team_ids(Role.MAINTAINER)
        if ids is None:
            team = default_team()
        else:
            teams = list(Team.objects.filter(pk__in=ids).order_by("name"))
            if len(teams) > 1:
                names = ", ".join(t.name for t in teams)
                raise InvalidInput(f"name the team the model belongs to: one of {names}")
            if not teams:
                raise Forbidden("registering a model needs the maintainer role in a team (you have none)")
            team = teams[0]
    require(principal, Action.CREATE_MODEL, team=team)
    return team
