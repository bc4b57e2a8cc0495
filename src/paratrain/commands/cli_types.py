"""Types for command-line flags: each flag is range-checked by the parser, so a bad value ends
in one line naming the flag (exit code 2), never in a traceback further down.

    p.add_argument("--steps", type=positive_int, default=50)
    p.add_argument("--interval", type=positive_seconds, default=2.0)
    p.add_argument("--nproc", type=int_list, default=None)          # "1,2,4"
    p.add_argument("--seq", type=int_in(1, 65536), default=128)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """A whole number from ``low`` to ``high``; ``type=int_in(1, 4096)``."""

    def parse(text: str) -> int:
        value = _int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} must be from {low} to {high}")
        return value

    parse.__name__ = f"int_in_{low}_{high}"
    return parse


def float_in(low: float, high: float) -> Callable[[str], float]:
    """A finite number from ``low`` to ``high``; ``type=float_in(0.001, 1.0)``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"{text} must be a number from {low:g} to {high:g}")
        return value

    parse.__name__ = f"float_in_{low:g}_{high:g}"
    return parse


def non_negative_float(text: str) -> float:
    """A finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be a finite number of 0 or more")
    return value


def non_negative_int(text: str) -> int:
    """A whole number >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return value


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a finite number of seconds above 0")
    return value


def int_list(text: str) -> list[int]:
    """A comma list of whole numbers >= 1, e.g. ``1,2,4``."""
    parts = text.split(",")
    if any(not p.strip() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty entry; write e.g. 1,2,4")
    return [positive_int(p.strip()) for p in parts]
