"""The API's JSON parser: DRF's, with a size limit and a nesting limit.

Kept apart from ``modelyard.api``, which imports DRF's views: DRF reads ``DEFAULT_PARSER_CLASSES``
while its views module loads.
"""

import json
import re

from django.conf import settings
from rest_framework import parsers, status
from rest_framework.exceptions import ParseError

# No request body of this API nests deeper than a few levels (config overrides, signatures).
MAX_JSON_DEPTH = 32


class BoundedJSONParser(parsers.JSONParser):
    """DRF's JSON parser with the bounds a public API needs: 413 for a body over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes and 400 for one nested deeper than ``MAX_JSON_DEPTH``
    levels (Python's parser would otherwise exhaust its recursion limit: a 500).

    Raises:
        ParseError: invalid JSON or too deep (400, ``{"detail": ...}``).
        BodyTooLarge: over the size limit (413).
    """

    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(limit + 1) if stream is not None else b""
        if limit is not None and len(raw) > limit:
            raise BodyTooLarge(f"the JSON body is larger than {limit} bytes, the limit")
        if not raw:
            raise ParseError("the JSON body is empty")
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        try:
            text = raw.decode(encoding)
            _check_depth(text)
            return json.loads(text)
        except (UnicodeDecodeError, ValueError) as exc:
            raise ParseError(f"JSON parse error: {exc}") from exc


class BodyTooLarge(ParseError):
    """A request body over the size limit: 413 with ``{"detail": ...}``."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def _check_depth(text: str) -> None:
    """Refuse JSON text whose arrays and objects nest deeper than MAX_JSON_DEPTH, before parsing it.

    Strings are blanked out first (with their escapes), then brackets are counted.

    Raises:
        ParseError: too deep.
    """
    depth = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            raise ParseError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
