"""Template helpers of the monitoring pages."""

from django import template

register = template.Library()


def sparkline_points(points, size: str = "120x28", span: tuple[float, float] | None = None) -> str:
    """SVG polyline points for ``[[unix seconds, value], ...]`` in a ``WIDTHxHEIGHT`` box (pixels).

    Time runs left to right across ``span`` (start, end in unix seconds; default: the first and
    last point), so a burst sits where it happened and gaps stay gaps in width. The vertical
    scale runs from 0 (bottom edge) to the series' own peak (top edge): a sparkline shows a
    row's trend, not its size next to other rows. Returns "" for fewer than two points.
    """
    points = [(float(t), float(v)) for t, v in points or []]
    if len(points) < 2:
        return ""
    width, height = (int(x) for x in size.split("x"))
    start, end = span if span else (points[0][0], points[-1][0])
    duration = (end - start) or 1.0
    values = [v for _, v in points]
    low = min(0.0, min(values))
    rise = (max(values) - low) or 1.0
    return " ".join(
        f"{(t - start) / duration * width:.1f},{height - 1 - (v - low) / rise * (height - 2):.1f}" for t, v in points
    )


def sparkline_peak(points) -> float | None:
    """The top of a sparkline's vertical scale: the series' peak value (its bottom is 0), or None
    when ``sparkline_points`` draws nothing (fewer than two points)."""
    values = [float(v) for _, v in points or []]
    if len(values) < 2:
        return None
    return max(0.0, max(values))


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
