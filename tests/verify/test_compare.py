"""Comparing states: bit for bit by default, within --atol when asked, and what is named."""

from __future__ import annotations

import math

import pytest
import torch

from paratrain.commands.verify.compare import compare


def test_identical_nested_states_have_no_difference() -> None:
    state = {
        "rank 0": {"models": {"model": {"w": torch.arange(6.0).reshape(2, 3)}}},
        "loop": {"epoch": 2, "global_step": 9},
        "rng": (3, (1, 2, 3), None),
        "extras": {"best": 0.5, "name": "x", "raw": b"\x00\x01"},
    }
    assert compare(state, state) == []


def test_bit_for_bit_by_default_and_within_atol_when_asked() -> None:
    a = {"w": torch.tensor([1.0, 2.0, 3.0])}
    b = {"w": torch.tensor([1.0, 2.0 + 1e-6, 3.0])}
    [difference] = compare(a, b)
    assert difference.path == "w"
    assert difference.max_abs == pytest.approx(1e-6, rel=0.1)
    assert difference.detail.startswith("max |Δ| 9.5")
    assert compare(a, b, atol=1e-5) == []
    assert compare(a, b, atol=1e-7) != []
    assert compare({"lr": 0.1}, {"lr": 0.1 + 1e-12}) != []
    assert compare({"lr": 0.1}, {"lr": 0.1 + 1e-12}, atol=1e-9) == []


def test_nan_matches_nan_but_not_a_number_and_signed_zeros_differ_bitwise() -> None:
    nan = torch.tensor([math.nan, 1.0])
    assert compare(nan, nan.clone()) == []
    [difference] = compare(nan, torch.tensor([0.0, 1.0]), atol=1.0)
    assert difference.max_abs == math.inf
    assert compare(torch.tensor([0.0]), torch.tensor([-0.0])) != []
    assert compare(torch.tensor([0.0]), torch.tensor([-0.0]), atol=1e-9) == []
    assert compare(math.nan, math.nan) == []
    assert compare(0.0, -0.0) != []


def test_integers_and_text_stay_exact_whatever_the_atol() -> None:
    assert compare({"step": 9}, {"step": 10}, atol=5)[0].detail == "9 vs 10"
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 3]), atol=5)[0].max_abs == 1
    assert compare(torch.tensor([True]), torch.tensor([False]))[0].detail == "1 of 1 values differ"
    assert "bytes differ" in compare(b"ab", b"abc")[0].detail
    assert compare("a", "b")[0].detail == "'a' vs 'b'"


def test_differing_keys_shapes_dtypes_and_lengths_are_named_with_their_path() -> None:
    a = {"models": {"m": {"w": torch.zeros(2), "b": torch.zeros(3), "x": torch.zeros(1)}}}
    b = {"models": {"m": {"w": torch.zeros(3), "b": torch.zeros(3, dtype=torch.float64)}}}
    b["models"]["extra"] = {}
    found = {d.path: d.detail for d in compare(a, b, names=("reference", "killed run"))}
    assert found == {
        "models/m/w": "shape (2,) vs (3,)",
        "models/m/b": "dtype torch.float32 vs torch.float64",
        "models/m/x": "only in the reference",
        "models/extra": "only in the killed run",
    }
    assert compare([1, 2], [1, 2, 3])[0].detail == "2 items vs 3"
    assert compare({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]})[0].path == "a/1/b"


def test_the_first_difference_follows_the_order_of_the_first_state() -> None:
    a = {"models": {"w": torch.ones(2)}, "optimizers": {"lr": 0.1}, "loop": {"step": 1}}
    b = {"models": {"w": torch.zeros(2)}, "optimizers": {"lr": 0.2}, "loop": {"step": 2}}
    assert [d.path for d in compare(a, b)] == ["models/w", "optimizers/lr", "loop/step"]


def test_files_named_differently_are_not_called_nondeterminism() -> None:
    from paratrain.commands.verify.render import not_deterministic

    first = {"files": {"out-1.pt": b"x"}}
    second = {"files": {"out-2.pt": b"x"}}
    text = not_deterministic(compare(first, second)[0], "out-*.pt")
    assert "have other names" in text and "out-1.pt" in text and "not deterministic" not in text
    text = not_deterministic(compare({"w": 1.0}, {"w": 2.0})[0], None)
    assert "not deterministic" in text


def test_excluded_paths_are_left_out_and_nothing_else() -> None:
    first = {"rank 0": {"extras": {"started": 1.0, "best": 0.5}, "w": torch.ones(2)}}
    second = {"rank 0": {"extras": {"started": 2.0, "best": 0.5, "pid": 7}, "w": torch.ones(2)}}
    assert [d.path for d in compare(first, second)] == [
        "rank 0/extras/started",
        "rank 0/extras/pid",
    ]
    assert compare(first, second, ignore=("rank */extras/started", "*/pid")) == []
    second["rank 0"]["w"] = torch.zeros(2)
    found = compare(first, second, ignore=("rank */extras",))
    assert [d.path for d in found] == ["rank 0/w"]
