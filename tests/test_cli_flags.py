"""Every numeric flag is range-checked by the parser: a bad value exits with code 2 and a line
naming the flag, never a traceback; a good one parses to a value in range."""

from __future__ import annotations

import argparse
import contextlib
import io
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paratrain.commands.cli import build_parser, parse

# (command, flag, smallest allowed value) for each range-checked flag
FLAGS = [
    ("bench", "--width", 1), ("bench", "--depth", 1), ("bench", "--image-size", 1),
    ("bench", "--seq", 1), ("bench", "--batch-size", 1), ("bench", "--steps", 1),
    ("bench", "--warmup", 0), ("bench", "--rounds", 1), ("demo", "--epochs", 1),
    ("demo", "--batch-size", 1), ("demo", "--grad-accum", 1), ("run", "--nnodes", 1),
    ("run", "--node-rank", 0), ("run", "--max-restarts", 0),
]  # fmt: skip
TEXT = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", "abc", "1,,2", "nan", "inf", "-0", "0x10", " 3", "1e3", "2.5"]),
)


def _parse(argv: list[str]) -> argparse.Namespace | int:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse(build_parser(), argv)
    except SystemExit as stop:
        assert stop.code == 2
        assert "Traceback" not in err.getvalue() and "error: argument" in err.getvalue()
        return 2


@settings(max_examples=200, deadline=None)
@given(flag=st.sampled_from(FLAGS), text=TEXT)
def test_numeric_flags_are_range_checked(flag: tuple[str, str, int], text: str) -> None:
    command, name, low = flag
    tail = ["script.py"] if command == "run" else []
    parsed = _parse([command, f"{name}={text}", *tail])
    if parsed != 2:
        assert isinstance(parsed, argparse.Namespace)
        value = getattr(parsed, name.lstrip("-").replace("-", "_"))
        values = value if isinstance(value, tuple) else (value,)  # --nnodes: (MIN, MAX)
        assert min(values) >= low


@given(text=TEXT)
def test_monitor_interval_is_finite_and_positive(text: str) -> None:
    parsed = _parse(["monitor", f"--interval={text}"])
    if parsed != 2:
        assert isinstance(parsed, argparse.Namespace)
        assert math.isfinite(parsed.interval) and parsed.interval > 0


@pytest.mark.parametrize("text", ["1,,2", "0,1", "a", ",", "-1"])
def test_bench_nproc_lists_are_checked(text: str) -> None:
    assert _parse(["bench", f"--nproc={text}"]) == 2
    parsed = _parse(["bench", "--nproc=1,2,4"])
    assert isinstance(parsed, argparse.Namespace) and parsed.nproc == [1, 2, 4]


def test_run_takes_a_module() -> None:
    parsed = _parse(["run", "--nproc", "2", "-m", "pkg.train", "--epochs", "3"])
    assert isinstance(parsed, argparse.Namespace)
    assert parsed.target == ["-m", "pkg.train", "--epochs", "3"] and parsed.nproc == "2"
