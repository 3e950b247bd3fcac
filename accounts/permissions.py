"""REST API permissions: an API token's scopes bound what a request may do, whatever the view, and
the administrator-only rules of fleet-wide resources."""

from rest_framework import permissions

from accounts.access import Principal
from accounts.choices import Scope
from accounts.models import ApiToken


def required_scope(request, view) -> str:
    """The scope a request needs from its API token.

    ``GET``, ``HEAD`` and ``OPTIONS`` need ``read``. Other methods need the view's
    ``required_scope`` attribute, ``write`` without one. ``required_scope`` is either a
    :class:`Scope` value or a dict from a viewset action name (``"create"``, ``"pause"``) or an
    upper-case HTTP method to a scope, with an optional ``"default"`` entry; e.g. a deployment
    viewset sets ``required_scope = Scope.DEPLOY``, a host viewset ``Scope.ADMIN``.
    """
    if request.method in permissions.SAFE_METHODS:
        return Scope.READ
    wanted = getattr(view, "required_scope", None)
    if isinstance(wanted, dict):
        action = getattr(view, "action", None)
        wanted = wanted.get(action) or wanted.get(request.method) or wanted.get("default")
    return wanted or Scope.WRITE


class TokenScopePermission(permissions.BasePermission):
    """Refuse (403) a request authenticated by an API token that lacks the scope it needs.

    A browser session (no token) is not limited here. The scope needed is
    :func:`required_scope`. This checks only the token: the user's own rights (roles in teams,
    administrator) are checked by the view through ``accounts.access``.
    """

    message = "this API token lacks the needed scope"

    def has_permission(self, request, view) -> bool:
        token = getattr(request, "auth", None)
        if not isinstance(token, ApiToken):
            return True
        scope = required_scope(request, view)
        if token.allows(scope):
            return True
        self.message = f"this API token lacks the '{scope}' scope (it has: {', '.join(token.scopes) or 'none'})"
        return False


class AdminCanWrite(permissions.BasePermission):
    """Any signed-in principal may read; only administrators (with the ``admin`` scope on a token) may
    change. List ``TokenScopePermission`` beside it for the token's scopes.

    For resources whose URLs the server itself will call (serving hosts): letting any user
    point the fleet at an address would let them make the server reach internal services.
    """

    message = "only administrators may change this"

    def has_permission(self, request, view) -> bool:
        principal = Principal.of(request)
        if not principal.is_authenticated:
            return False
        return request.method in permissions.SAFE_METHODS or principal.is_admin


class AdminOnly(permissions.BasePermission):
    """Administrators only (with the ``admin`` scope on a token), for reading too: webhooks, teams' writes."""

    message = "only administrators may do this"

    def has_permission(self, request, view) -> bool:
        return Principal.of(request).is_admin
