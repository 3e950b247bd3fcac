"""How an audit event's details read on a page: labelled plain values, not JSON or Python reprs."""

import json

MISSING = "—"


def display_value(value) -> str:
    """One JSON value as text: ``None`` and the empty string as "—", booleans as yes/no, a list of plain
    values joined by commas, a ``{"from": a, "to": b}`` change as "a → b", any other object as compact JSON."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict) and set(value) == {"from", "to"}:
        return f"{display_value(value['from'])} → {display_value(value['to'])}"
    if isinstance(value, list) and not any(isinstance(v, dict | list) for v in value):
        return ", ".join(display_value(v) for v in value) if value else MISSING
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))


def _label(key: str) -> str:
    return str(key).replace("_", " ")


def detail_items(data) -> list[tuple[str, str]]:
    """An audit event's ``data`` (a JSON object) as (label, text) pairs, in the order the database keeps.

    A top-level ``from``/``to`` pair reads as one "change" item ("owner → viewer"); ``before`` and
    ``after`` objects as one item per field that changed ("production: no → yes"); a nested object
    as one item per field, labelled ``outer · inner``. Anything that is not an object is one item
    labelled "details".

    Returns:
        A list of (label, text); empty for empty data.
    """
    if not isinstance(data, dict):
        return [] if data in (None, "") else [("details", display_value(data))]
    items: list[tuple[str, str]] = []
    before, after = data.get("before"), data.get("after")
    paired = isinstance(before, dict) and isinstance(after, dict)
    for key, value in data.items():
        if key == "from" and "to" in data:
            items.append(("change", f"{display_value(value)} → {display_value(data['to'])}"))
        elif key == "to" and "from" in data:
            continue
        elif paired and key == "before":
            items.extend((_label(field), f"{display_value(before.get(field))} → {display_value(after.get(field))}")
                         for field in [*before, *(f for f in after if f not in before)]
                         if before.get(field) != after.get(field))
        elif paired and key == "after":
            continue
        elif isinstance(value, dict) and value and set(value) != {"from", "to"}:
            items.extend((f"{_label(key)} · {_label(inner)}", display_value(v)) for inner, v in value.items())
        else:
            items.append((_label(key), display_value(value)))
    return items
