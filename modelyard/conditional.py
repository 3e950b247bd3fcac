"""Conditional requests (RFC 9110, section 13): entity tags, and ``If-Match`` that turns a change into a
compare-and-set answered 412 when stale. ``If-None-Match`` and its 304 are Django's
``ConditionalGetMiddleware``'s, on the ``ETag`` an answer sets (or the digest of its body, where it sets none).

An entity tag made here (``entity_tag``) is a strong validator: ``"<hex>"``, the BLAKE2b digest (12 bytes)
of the JSON of the values it is computed from. ``registry.api.views`` gives a version's answer the tag of
its JSON and an alias's answers the tag of its state and of the version it names, so that a client sends it
back in ``If-Match`` to change the object only if nobody changed it since it looked.

Services stay free of HTTP: they take a ``precondition`` callable that they run under the row lock of the
change, with the row as it is then; ``precondition_from`` makes one from a request's ``If-Match``.
"""

import hashlib
import json
from collections.abc import Callable

from modelyard.errors import PreconditionFailed


def entity_tag(*values) -> str:
    """The strong entity tag (quoted, as the ``ETag`` header carries it) of JSON-serialisable ``values``;
    values JSON cannot hold (datetimes) count by their ``str``."""
    text = json.dumps(values, default=str, sort_keys=True, separators=(",", ":"))
    return '"' + hashlib.blake2b(text.encode(), digest_size=12).hexdigest() + '"'


def _tags(header: str) -> list[str]:
    """The entity tags of an ``If-Match`` value as sent: a weak one keeps its ``W/``, so under the strong
    comparison ``If-Match`` needs (RFC 9110, 13.1.1) it matches nothing."""
    return [tag.strip() for tag in header.split(",") if tag.strip()]


def precondition_from(request, what: str) -> Callable[[str | None], None] | None:
    """A check of ``request``'s ``If-Match`` against the entity tag of the current state, or None when
    the request sends no ``If-Match`` (the change is unconditional).

    The check takes the current tag (None when the resource does not exist) and raises
    ``PreconditionFailed`` (HTTP 412) when ``If-Match`` names none of it (``*`` needs only that it
    exists; RFC 9110, 13.1.1, strong comparison). ``what`` names the resource in the message.
    """
    header = request.headers.get("If-Match")
    if not header:
        return None
    tags = _tags(header)

    def check(current: str | None) -> None:
        if current is None:
            raise PreconditionFailed(f"{what} does not exist (If-Match: {header.strip()})")
        if "*" not in tags and current not in tags:
            raise PreconditionFailed(f"{what} changed since you read it: its ETag is {current} now, not "
                                     f"{header.strip()}; read it again and decide")

    return check
