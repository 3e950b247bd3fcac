"""Option values the ``modelyard`` commands share: JSON given on the command line, and sizes and
durations with units (``4MiB``, ``7d``)."""

import json

from modelyard_cli.client import CLIError

SIZE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "kb": 1000, "mb": 1000**2,
              "gb": 1000**3, "tb": 1000**4}
TIME_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_quantity(text: str, units: dict[str, int], what: str) -> int:
    """``text`` as a whole number of base units: ``256MiB`` -> 268435456 (bytes), ``7d`` -> 604800 (seconds).

    Raises:
        CLIError: not a number followed by one of ``units`` (the message names them).
    """
    clean = text.strip().lower()
    number = clean.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = clean[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1
    known = ", ".join(u for u in units if u)
    if unit not in units and value >= 0:
        raise CLIError(f"{what} {text!r}: unknown unit {unit!r}; the units are {known}")
    if unit not in units or value < 0:
        raise CLIError(f"{what} {text!r} must be a number with one of the units {known}")
    return round(value * units[unit])


def json_arg(flag: str, value: str):
    """``value``, the text given to option ``flag``, parsed as JSON.

    Raises:
        CLIError: not valid JSON (the message names ``flag``).
    """
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise CLIError(f"{flag} is not valid JSON: {exc.msg}") from exc
