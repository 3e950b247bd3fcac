"""Parsing of JSON objects typed by people: in multipart API fields and page forms."""

import json


def parse_json_object(raw: str) -> dict:
    """Parse ``raw`` as a JSON object.

    Returns:
        The object as a dict.

    Raises:
        ValueError: not JSON (the message gives the position) or not an object.
    """
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from exc
    if not isinstance(value, dict):
        raise ValueError("must be a JSON object")
    return value
