"""How quantities read on screen: bytes as GiB, durations as 1:05 / 2h03m, missing values as "n/a"."""

from __future__ import annotations

from collections.abc import Sequence

NA = "n/a"
_GIB = 1024**3
_SPARK = "▁▂▃▄▅▆▇█"


def gib(value_bytes: int | None, digits: int = 1) -> str:
    """76.0 (GiB, no unit); "n/a" when unknown."""
    if value_bytes is None:
        return NA
    return f"{value_bytes / _GIB:.{digits}f}"


def size(value_bytes: int | None) -> str:
    """A byte count with its unit: 812M, 76.0G."""
    if value_bytes is None:
        return NA
    if value_bytes >= _GIB:
        return f"{value_bytes / _GIB:.1f}G"
    if value_bytes >= 1024**2:
        return f"{value_bytes / 1024**2:.0f}M"
    return f"{value_bytes / 1024:.0f}K"


def duration(seconds: float | None) -> str:
    """0:42, 12:05, 2h03m; "n/a" when unknown."""
    if seconds is None:
        return NA
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}:{seconds % 60:02d}"


def minutes(seconds: float | None) -> str:
    """A coarse duration that changes once a minute: "<1 min", "42 min", "2h05m"."""
    if seconds is None:
        return NA
    if seconds < 60:
        return "<1 min"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    return duration(seconds)


def percent(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def bar(fraction: float | None, width: int) -> str:
    """A text bar that reads without colour: █ for the filled part, ░ for the rest."""
    if width <= 0:
        return ""
    if fraction is None:
        return "?" * width
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def sparkline(values: Sequence[float | None], width: int, maximum: float = 100.0) -> str:
    """The last ``width`` values as block characters (missing values as spaces)."""
    if width <= 0:
        return ""
    tail = values[-width:]
    chars = []
    for value in tail:
        if value is None:
            chars.append(" ")
        else:
            level = 0 if maximum <= 0 else max(0.0, min(1.0, value / maximum))
            chars.append(_SPARK[min(len(_SPARK) - 1, int(level * (len(_SPARK) - 1) + 0.5))])
    return " " * (width - len(chars)) + "".join(chars)
