"""Template helpers of the monitoring pages."""

from django import template

register = template.Library()


@register.filter
def sparkline_points(values, size: str = "120x28") -> str:
    """SVG polyline points for ``values`` scaled into a ``WIDTHxHEIGHT`` box (pixels).

    The lowest value sits on the bottom edge only when it is zero or below; a flat
    non-zero series sits mid-box. Returns "" for fewer than two values.
    """
    values = [float(v) for v in values or []]
    if len(values) < 2:
        return ""
    width, height = (int(x) for x in size.split("x"))
    top = max(values) or 1.0
    low = min(0.0, min(values))
    span = (top - low) or 1.0
    step = width / (len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - 1 - (v - low) / span * (height - 2):.1f}" for i, v in enumerate(values)
    )


@register.filter
def percent(value, digits: int = 2) -> str:
    """Format a 0..1 fraction as a percentage, or an em dash for None."""
    if value is None:
        return "—"
    return f"{float(value) * 100:.{int(digits)}f}%"


@register.filter
def number(value, digits: int = 2) -> str:
    """Format a number with ``digits`` decimals, or an em dash for None."""
    if value is None:
        return "—"
    return f"{float(value):.{int(digits)}f}"
