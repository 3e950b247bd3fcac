"""Conditional requests (RFC 9110, section 13): entity tags on what the API answers, ``If-None-Match``
answered 304, and ``If-Match`` that turns a change into a compare-and-set answered 412 when stale.

An entity tag here is a strong validator: ``"<hex>"``, the BLAKE2b digest (12 bytes) of the JSON of the
values it is computed from. What each resource's tag covers:

- a list or detail answer: its JSON body, so the tag changes exactly when the answer would
  (``tag_of_body``); a matching ``If-None-Match`` is a 304 with no body;
- an alias: its state, that is the version it names, whether it is locked and when it last changed
  (``registry.aliases.alias_etag``), on every answer about the alias (its GET, PUT and PATCH), so that a
  client sends it back in ``If-Match`` to move the alias only if nobody moved it since it looked.

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


def tag_of_body(data) -> str:
    """The entity tag of an answer's JSON body ``data`` (the serializer's output)."""
    return entity_tag(data)


def _tags(header: str) -> list[str]:
    """The entity tags of an ``If-Match`` or ``If-None-Match`` value, weak prefixes dropped."""
    return [tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()]


def not_modified(request, etag: str) -> bool:
    """True when ``request`` is a GET or HEAD whose ``If-None-Match`` names ``etag`` (or is ``*``):
    the client's copy is current, and a 304 answers it (RFC 9110, 13.1.2, weak comparison)."""
    header = request.headers.get("If-None-Match")
    if not header or request.method not in ("GET", "HEAD"):
        return False
    tags = _tags(header)
    return "*" in tags or etag in tags


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
