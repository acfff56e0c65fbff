"""Checks of user-given numbers: integers within a range (int64 at most) and finite floats; byte counts for people.

The command line's argument types (morphpipe.commands.arguments) and the Python API's boundaries
(batchers, samplers, native ops) share them, so NaN, an infinity, text or an integer beyond int64
gets the same one-line error everywhere: the field, the bad value and the range it must be in.
"""
from __future__ import annotations

import math
import operator

INT64_MAX = 2**63 - 1


def int_problem(value: object, minimum: int | None = None, maximum: int = INT64_MAX) -> str | None:
    """What is wrong with `value` as an integer in [minimum, maximum] ("must be ..., got ..."), or None."""
    is_integer = not isinstance(value, bool) and hasattr(type(value), "__index__")
    number = operator.index(value) if is_integer else None
    # The int64 limit is said only to a value beyond it: below it, it is noise.
    shown_maximum = None if maximum == INT64_MAX and (number is None or number <= maximum) else maximum
    wanted = "an integer" + _range_text(minimum, shown_maximum, False, False, maximum == INT64_MAX)
    if number is None:
        return f"must be {wanted}, got {_show(value)}"
    if (minimum is not None and number < minimum) or number > maximum:
        return f"must be {wanted}, got {number}"
    return None


def float_problem(value: object, minimum: float | None = None, maximum: float | None = None, *,
                  above: bool = False, below: bool = False) -> str | None:
    """What is wrong with `value` as a finite number within the bounds (`above`/`below`: the bound itself is
    excluded), or None."""
    wanted = "a finite number" + _range_text(minimum, maximum, above, below, False)
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(type(value), "__float__"):
        return f"must be {wanted}, got {_show(value)}"
    number = float(value)
    if not math.isfinite(number):
        return f"must be {wanted}, got {number}"
    if minimum is not None and (number < minimum or above and number == minimum):
        return f"must be {wanted}, got {value}"
    if maximum is not None and (number > maximum or below and number == maximum):
        return f"must be {wanted}, got {value}"
    return None


def check_int(name: str, value: object, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
    """`value` as an int in [minimum, maximum] (numpy and torch integers accepted), or a ValueError naming `name`."""
    problem = int_problem(value, minimum, maximum)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return operator.index(value)


def check_float(name: str, value: object, minimum: float | None = None, maximum: float | None = None, *,
                above: bool = False, below: bool = False) -> float:
    """`value` as a finite float within the bounds, or a ValueError naming `name`."""
    problem = float_problem(value, minimum, maximum, above=above, below=below)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    return float(value)


def _range_text(minimum: float | None, maximum: float | None, above: bool, below: bool, int64: bool) -> str:
    """' >= 1 and < 2**63 (int64)', ' > 0', '' ..."""
    bounds = []
    if minimum is not None:
        bounds.append(f"{'>' if above else '>='} {_number(minimum)}")
    if maximum is not None:
        bounds.append("< 2**63 (int64)" if int64 else f"{'<' if below else '<='} {_number(maximum)}")
    return f" {' and '.join(bounds)}" if bounds else ""


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def format_bytes(count: float) -> str:
    """`count` bytes in MiB (GiB from 1 GiB up), for messages and logs."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"
