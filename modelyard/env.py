"""Small typed readers for settings that come from environment variables.

Each reader returns the default when the variable is unset or empty and raises
``ImproperlyConfigured`` with the variable's name when a value cannot be parsed.
"""

import json
import os

from django.core.exceptions import ImproperlyConfigured


def env_str(name: str, default: str = "") -> str:
    """Return the variable ``name`` as a string, or ``default`` when unset or empty."""
    value = os.environ.get(name, "")
    return value if value != "" else default


def env_bool(name: str, default: bool = False) -> bool:
    """Return ``name`` parsed as a boolean (1/true/yes/on, 0/false/no/off).

    Raises:
        ImproperlyConfigured: the value is not one of those words.
    """
    raw = env_str(name).strip().lower()
    if raw == "":
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int) -> int:
    """Return ``name`` parsed as an integer.

    Raises:
        ImproperlyConfigured: the value is not an integer.
    """
    raw = env_str(name).strip()
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc


def env_float(name: str, default: float) -> float:
    """Return ``name`` parsed as a float.

    Raises:
        ImproperlyConfigured: the value is not a number.
    """
    raw = env_str(name).strip()
    if raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc


def env_list(name: str, default: list[str]) -> list[str]:
    """Return ``name`` split on commas, blanks dropped."""
    raw = env_str(name)
    if raw == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_json(name: str, default):
    """Return ``name`` parsed as JSON.

    Raises:
        ImproperlyConfigured: the value is not valid JSON.
    """
    raw = env_str(name)
    if raw == "":
        return default
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{name} must be JSON: {exc}") from exc
