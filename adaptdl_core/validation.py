"""Checks of numeric arguments, with errors that name the argument and what it needs.

The library checks a scalar count, size, fraction or duration given to a public function
or class (and an ``ADAPTDL_*`` variable once parsed) with :func:`number` or
:func:`integer`, so that bad input fails at the call with a message such as
``smoothing must be a finite number in (0, 1), got 1.5``. Checks of arrays
(``adaptdl_core.goodput``, ``adaptdl_core.policy.speedup``), of relations between
arguments (``max_replicas >= min_replicas``) and of text that does not parse as a number
stay with their modules, whose messages say more than a range can.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["number", "integer"]


def _bound_text(bound: float) -> str:
    """A bound as written: integers in full (``16384``, ``1000000``), floats short."""
    return str(bound) if isinstance(bound, numbers.Integral) else f"{bound:g}"


def _range_text(low: float | None, high: float | None, low_open: bool,
                high_open: bool) -> str:
    lo, hi = (None if b is None else _bound_text(b) for b in (low, high))
    if lo is not None and hi is not None:
        return f" in {'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"
    if lo is not None:
        return f" {'>' if low_open else '>='} {lo}"
    if hi is not None:
        return f" {'<' if high_open else '<='} {hi}"
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
            a number (bools and strings included: ``"1.5"`` is text to parse, not a
            number), not finite, or out of range.
    """
    def fail() -> ValueError:
        return ValueError(f"{name} must be {what}{_range_text(low, high, low_open, high_open)}"
                          f", got {value!r}")

    if isinstance(value, (bool, str, bytes)):
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


def integer(name: str, value: Any, low: int | None = None, high: int | None = None, *,
            integral_floats: bool = False, what: str = "an integer") -> int:
    """``value`` as an int within ``[low, high]`` (each ``None``: unbounded): an integer
    (numpy's included, bools not) or, with ``integral_floats``, a finite number with an
    integer value (``64.0``, as a batch size computed in floating point).

    Arguments:
        name: the argument's name, for the message.
        what: how the message calls an acceptable value (``"None or an integer"``).

    Raises:
        ValueError: ``"<name> must be <what><range>, got <value>"``.
    """
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if not ok and integral_floats and isinstance(value, numbers.Real) \
            and not isinstance(value, bool):
        ok = math.isfinite(value) and float(value).is_integer()
    out = int(value) if ok else 0
    if not ok or (low is not None and out < low) or (high is not None and out > high):
        raise ValueError(f"{name} must be {what}{_range_text(low, high, False, False)}, "
                         f"got {value!r}")
    return out
