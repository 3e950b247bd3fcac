"""REST API authentication by API token: ``Authorization: Bearer <token>`` (or ``Token <token>``).

Bearer is the scheme of RFC 6750; ``Token`` is still accepted because older CLI versions,
scripts and Prometheus configs (``authorization: {type: Token}``) send it.
"""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from accounts.tokens import TokenRejected, authenticate_token, mark_used

KEYWORDS = (b"bearer", b"token")


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """Authenticate a request by the API token in its ``Authorization`` header.

    A request without such a header is left to the next authentication class (the browser's
    session). A header naming a token that cannot be used is answered 401 with a message saying
    why (unknown, revoked, expired, inactive user); nothing else is tried then.

    ``request.user`` becomes the token's user and ``request.auth`` the ``ApiToken``, whose scopes
    and team limit ``accounts.access`` and ``accounts.permissions`` apply. The token's
    ``last_used_at`` is refreshed at most once a minute (``accounts.tokens.mark_used``): one
    ``SELECT`` per request, plus one ``UPDATE`` at most each minute.
    """

    def authenticate(self, request):
        """Return ``(user, ApiToken)``, or None without a Bearer/Token header.

        Raises:
            AuthenticationFailed: a malformed header or a token that cannot be used (HTTP 401).
        """
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() not in KEYWORDS:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "invalid Authorization header: send 'Authorization: Bearer <token>' with no spaces in the token")
        try:
            plaintext = header[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("invalid API token: it has characters outside ASCII") from exc
        try:
            token = authenticate_token(plaintext)
        except TokenRejected as exc:
            raise exceptions.AuthenticationFailed(exc.message) from exc
        mark_used(token)
        return token.user, token

    def authenticate_header(self, request) -> str:
        """The ``WWW-Authenticate`` value, so that a refusal is a 401 and not a 403."""
        return 'Bearer realm="api"'


class ApiTokenAuthenticationScheme(OpenApiAuthenticationExtension):
    """OpenAPI description of :class:`ApiTokenAuthentication`: an HTTP bearer scheme."""

    target_class = "accounts.authentication.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token (`my_<prefix>_<secret>`) from /account/tokens/, POST /api/v1/tokens/ or "
                           "`manage.py create_api_token`. `Authorization: Token <token>` is accepted too.",
        }
