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
import re
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


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}  # fmt: skip


def memory_size(text: str) -> int:
    """``80GiB``, ``24GB``, ``512MiB``, ``1e9`` -> bytes (argparse type)."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([KMGT]?i?B?)\s*", text, re.I)
    if not found or found.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a memory size: write it as 80GiB, 24GB or 512MiB"
        )
    return int(float(found.group(1)) * _UNITS[found.group(2).upper()])
