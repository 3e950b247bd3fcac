"""Template helpers of the monitoring pages."""

from django import template

register = template.Library()


@register.filter
def sparkline_points(values, size: str = "120x28") -> str:
    """SVG polyline points for ``values`` scaled into a ``WIDTHxHEIGHT`` box (pixels).

    The vertical scale runs from 0 (bottom edge) to the series' own peak (top edge), so a
    sparkline shows a row's trend, not its size next to other rows; a flat non-zero series
    runs along the top. Returns "" for fewer than two values.
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


@register.filter
def binary_bytes(value) -> str:
    """Format a byte count with binary units (KiB, MiB, GiB, TiB), or an em dash for None."""
    if value is None:
        return "—"
    size = float(value)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f}\u00a0{unit}"
        size /= 1024
    return f"{size:.1f}\u00a0TiB"
