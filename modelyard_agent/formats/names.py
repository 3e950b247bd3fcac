"""The model name grammar, shared by Triton and BentoML.

Triton uses a model's name as a directory name in the model repository and in
URLs (``/v2/models/<name>``); BentoML lowercases tags and allows only
``[a-z0-9_.-]``, at most 63 characters, starting with an alphanumeric. The
registry accepts the intersection, without dots so that no name can read as a
relative path segment:

    ^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$

Input is NFKC-normalised and trimmed first; upper-case letters are refused
rather than silently lowercased, so two spellings never map to one name.
"""

import re
import unicodedata

NAME_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$")
NAME_MAX_LENGTH = 63
# Host agents load a profile's copy of a model as ``<model>--profile-<id>``: no model may be named so.
PROFILE_INFIX = "--profile-"
# ... and a replay's copy of a candidate version as ``<model>--replay-<id>``.
REPLAY_INFIX = "--replay-"
NAME_RULE = (
    "1-63 characters: lower-case letters, digits, '-' and '_', "
    "starting and ending with a letter or digit"
)


class InvalidName(ValueError):
    """A name that breaks the grammar; the message says why."""


def normalize_name(raw: str) -> str:
    """Return ``raw`` NFKC-normalised and trimmed, without validating it."""
    return unicodedata.normalize("NFKC", raw).strip()


def validate_name(raw: str, *, kind: str = "model name") -> str:
    """Normalise ``raw`` and check it against the grammar.

    Args:
        raw: the name as the user typed it.
        kind: what the name is for, used in the error message.

    Returns:
        The normalised name.

    Raises:
        InvalidName: the name is empty, too long, or has characters outside the grammar; or a
            model name holds ``PROFILE_INFIX``.
    """
    name = normalize_name(raw)
    if not name:
        raise InvalidName(f"{kind} must not be empty")
    if len(name) > NAME_MAX_LENGTH:
        raise InvalidName(f"{kind} {name[:20]!r}… is longer than {NAME_MAX_LENGTH} characters ({len(name)})")
    if name.lower() != name:
        hint = f"; use {name.lower()!r}" if NAME_PATTERN.match(name.lower()) else ""
        raise InvalidName(f"{kind} {name!r} has upper-case letters{hint}: {NAME_RULE}")
    if not NAME_PATTERN.match(name):
        raise InvalidName(f"{kind} {name!r} is not valid: {NAME_RULE}")
    if kind == "model name" and PROFILE_INFIX in name:
        raise InvalidName(f"{kind} {name!r} holds {PROFILE_INFIX!r}, which names the copies performance "
                          "profiles load")
    if kind == "model name" and REPLAY_INFIX in name:
        raise InvalidName(f"{kind} {name!r} holds {REPLAY_INFIX!r}, which names the copies replays load")
    return name


ALIAS_PATTERN = re.compile(r"^[a-z](?:[a-z0-9_-]{0,61}[a-z0-9])?$")
RESERVED_ALIASES = frozenset({"latest"})


def validate_alias(raw: str) -> str:
    """Normalise and check an alias name: like a model name but starting with a letter, so it
    never reads as a version number; ``latest`` is reserved (it is computed).

    Raises:
        InvalidName: the alias breaks the grammar or is reserved.
    """
    name = normalize_name(raw)
    if name in RESERVED_ALIASES:
        raise InvalidName(f"alias {name!r} is reserved: it always means the newest version")
    if len(name) > NAME_MAX_LENGTH:
        raise InvalidName(f"alias {name[:20]!r}… is {len(name)} characters long; the limit is {NAME_MAX_LENGTH}")
    if not name or len(name) > NAME_MAX_LENGTH or name.lower() != name or not ALIAS_PATTERN.match(name):
        raise InvalidName(
            f"alias {name!r} is not valid: 1-63 characters of lower-case letters, digits, '-' and '_', "
            "starting with a letter and ending with a letter or digit"
        )
    return name
