"""Checks of numeric arguments, with errors that name the argument and what it needs.

Every public function of the library that takes a count, a size, a fraction or a
duration validates it with :func:`number` or :func:`integer`, so that bad input fails
at the call with a message such as ``smoothing must be a number in (0, 1), got 1.5``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["number", "integer"]


def _range_text(low: float | None, high: float | None, low_open: bool,
                high_open: bool) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high:g}"
    return ""


def number(name: str, value: Any, low: float | None = None, high: float | None = None, *,
           low_open: bool = False, high_open: bool = False, what: str = "a finite number"
           ) -> float:
    """``value`` as a finite float within the bounds (each ``None``: unbounded; ``*_open``:
    the bound itself is excluded).

    Arguments:
        name: the argument's name, for the message.
        what: how the message calls an acceptable value (``"a number of samples"``).

    Raises:
        ValueError: ``"<name> must be <what><range>, got <value>"`` for a value that is not
            a number (bools included), not finite, or out of range.
    """
    def fail() -> ValueError:
        return ValueError(f"{name} must be {what}{_range_text(low, high, low_open, high_open)}"
                          f", got {value!r}")

    if isinstance(value, bool):
        raise fail()
    try:
        out = float(value)
    except (TypeError, ValueError, OverflowError):
        raise fail() from None
    if not math.isfinite(out) \
            or (low is not None and (out <= low if low_open else out < low)) \
            or (high is not None and (out >= high if high_open else out > high)):
        raise fail()
    return out


def integer(name: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """``value``, an int (not a bool, not a float) within ``[low, high]`` (each ``None``:
    unbounded).

    Raises:
        ValueError: ``"<name> must be an integer<range>, got <value>"``.
    """
    ok = isinstance(value, int) and not isinstance(value, bool)
    out = value if ok else 0
    if not ok or (low is not None and out < low) or (high is not None and out > high):
        raise ValueError(f"{name} must be an integer{_range_text(low, high, False, False)}, "
                         f"got {value!r}")
    return out
