"""Compare two runs' states: nested dicts, lists, tensors, numbers, text and bytes.

    differences = compare(reference, resumed, atol=0.0)      # [] when identical
    differences[0].path       # "rank 0/models/model/0.weight"
    differences[0].detail     # "max |Δ| 3.1e-03"

Bit for bit by default: floats and float tensors must be equal (NaN where the other has NaN);
``atol`` allows max |Δ| ≤ atol for floats (integers, text and bytes stay exact). Keys are walked
in the first state's order, so the first difference is the first one in the order the caller
built the state (models before optimizers before counters).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

MAX_DIFFERENCES = 200
"""Differences collected per comparison (the rest are counted, not described)."""


@dataclass(frozen=True, slots=True)
class Difference:
    """One place where the states differ."""

    path: str
    """Keys from the root, joined by ``/``."""
    detail: str
    """What differs: ``max |Δ| 3.1e-03``, ``shape (3,) vs (4,)``, ``only in the first``."""
    max_abs: float | None = None
    """max |Δ| for numbers and tensors of the same shape (inf where a NaN is unmatched)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.detail}"


def compare(
    a: Any,
    b: Any,
    *,
    atol: float = 0.0,
    names: tuple[str, str] = ("first", "second"),
    ignore: tuple[str, ...] = (),
) -> list[Difference]:
    """Every difference between ``a`` and ``b`` (up to :data:`MAX_DIFFERENCES`), leaving out
    those at a path that matches a glob of ``ignore`` (or lies below one)."""
    found: list[Difference] = []
    _walk(a, b, "", atol, names, found, ignore)
    return found


def _walk(
    a: Any,
    b: Any,
    path: str,
    atol: float,
    names: tuple[str, str],
    found: list[Difference],
    ignore: tuple[str, ...] = (),
) -> None:
    if len(found) >= MAX_DIFFERENCES:
        return
    if ignore and path and _ignored(path, ignore):
        return
    here = path or "(root)"
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        difference = tensors(a, b, atol)
        if difference is not None:
            found.append(Difference(here, *difference))
    elif isinstance(a, Mapping) and isinstance(b, Mapping):
        for key, value in a.items():
            child = f"{path}/{key}" if path else str(key)
            if key in b:
                _walk(value, b[key], child, atol, names, found, ignore)
            elif not _ignored(child, ignore):
                found.append(Difference(child, f"only in the {names[0]}"))
        for key in b:
            child = f"{path}/{key}" if path else str(key)
            if key not in a and not _ignored(child, ignore):
                found.append(Difference(child, f"only in the {names[1]}"))
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            found.append(Difference(here, f"{len(a)} items vs {len(b)}"))
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _walk(x, y, f"{path}/{i}" if path else str(i), atol, names, found, ignore)
    else:
        difference = scalars(a, b, atol)
        if difference is not None:
            found.append(Difference(here, *difference))


def _ignored(path: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def tensors(a: torch.Tensor, b: torch.Tensor, atol: float) -> tuple[str, float | None] | None:
    """None when equal (within ``atol`` for floating tensors), else (detail, max |Δ|)."""
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs {b.dtype}", None
    if a.shape != b.shape:
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}", None
    if a.numel() == 0:
        return None
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_floating_point() or a.is_complex():
        both_nan = torch.isnan(a) & torch.isnan(b)
        wide = torch.complex128 if a.is_complex() else torch.float64
        delta = (a.to(wide) - b.to(wide)).abs()
        delta = torch.where((a == b) | both_nan, torch.zeros_like(delta), delta)
        delta = torch.nan_to_num(delta, nan=math.inf)  # a NaN against a number
        biggest = float(delta.max())
        if biggest <= atol and (atol > 0 or _same_zeros(a, b, both_nan)):
            return None
        return f"max |Δ| {biggest:.3g}" if biggest else "0.0 against -0.0", biggest
    if torch.equal(a, b):
        return None
    if a.dtype == torch.bool:
        count = int((a != b).sum())
        return f"{count} of {a.numel()} values differ", None
    biggest = float((a.to(torch.float64) - b.to(torch.float64)).abs().max())
    return f"max |Δ| {biggest:.6g}", biggest


def _same_zeros(a: torch.Tensor, b: torch.Tensor, both_nan: torch.Tensor) -> bool:
    """Bit for bit, 0.0 and -0.0 differ (equal values otherwise, NaN where both have one)."""
    if a.is_complex():
        return True
    return bool(((torch.signbit(a) == torch.signbit(b)) | both_nan).all())


def scalars(a: Any, b: Any, atol: float) -> tuple[str, float | None] | None:
    """None when equal, else (detail, max |Δ| or None); floats within ``atol`` are equal."""
    numbers = (int, float)
    if (
        isinstance(a, bool)
        or isinstance(b, bool)
        or not (isinstance(a, numbers) and isinstance(b, numbers))
    ):
        if type(a) is type(b) and a == b:
            return None
        if isinstance(a, bytes) and isinstance(b, bytes):
            return f"bytes differ ({len(a)} vs {len(b)} bytes)", None
        return f"{_short(a)} vs {_short(b)}", None
    if isinstance(a, int) and isinstance(b, int):
        return None if a == b else (f"{a} vs {b}", float(abs(a - b)))
    if math.isnan(a) and math.isnan(b):
        return None
    delta = math.inf if math.isnan(a) or math.isnan(b) else abs(a - b) if a != b else 0.0
    if delta <= atol and (atol > 0 or math.copysign(1, a) == math.copysign(1, b)):
        return None
    return f"{a!r} vs {b!r} (|Δ| {delta:.3g})", delta


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
