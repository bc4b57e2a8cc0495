"""The comparison of a crashed-and-resumed run with an uninterrupted one finds every difference."""

from __future__ import annotations

from pathlib import Path

import torch

from paratrain.commands.demo.artefacts import DemoFiles
from paratrain.commands.demo.resume_check import check_resume
from tests.demo.fake_runs import loss_at, write_run


def _reference(tmp_path: Path) -> DemoFiles:
    """The uninterrupted run: 12 steps in one attempt."""
    return write_run(tmp_path / "reference", attempts=[range(1, 13)], epochs=3)


def test_an_exact_resume_matches(tmp_path: Path) -> None:
    resumed = write_run(tmp_path / "run", attempts=[range(1, 7), range(5, 13)], epochs=3)
    check = check_resume(resumed, _reference(tmp_path))
    assert check.matches
    assert (check.crashed_after, check.resumed_at, check.redone) == (6, 4, 2)
    assert check.steps == 12 and check.first_difference is None
    assert check.weights_equal and check.weights_max_diff == 0.0


def test_a_loss_after_the_resume_that_differs_in_the_last_bit_is_found(tmp_path: Path) -> None:
    off = {9: loss_at(9) * (1 + 2**-52)}
    resumed = write_run(
        tmp_path / "run", attempts=[range(1, 7), range(5, 13)], epochs=3, losses=off
    )
    check = check_resume(resumed, _reference(tmp_path))
    assert not check.matches and check.first_difference == 9
    assert check.redone_equal and check.weights_equal


def test_different_weights_are_found_with_their_size(tmp_path: Path) -> None:
    weights = {"w": torch.arange(6.0).reshape(2, 3) + torch.tensor([[0, 0, 0], [0, 1e-3, 0]])}
    resumed = write_run(
        tmp_path / "run", attempts=[range(1, 7), range(5, 13)], epochs=3, weights=weights
    )
    check = check_resume(resumed, _reference(tmp_path))
    assert not check.matches and not check.weights_equal
    assert abs(check.weights_max_diff - 1e-3) < 1e-6
    assert check.first_difference is None


def test_weights_with_other_names_do_not_match(tmp_path: Path) -> None:
    weights = {"v": torch.arange(6.0).reshape(2, 3)}
    resumed = write_run(
        tmp_path / "run", attempts=[range(1, 7), range(5, 13)], epochs=3, weights=weights
    )
    check = check_resume(resumed, _reference(tmp_path))
    assert not check.weights_equal and check.weights_max_diff == float("inf")


def test_a_crash_right_after_a_checkpoint_redoes_no_step(tmp_path: Path) -> None:
    resumed = write_run(tmp_path / "run", attempts=[range(1, 5), range(5, 13)], epochs=3)
    check = check_resume(resumed, _reference(tmp_path))
    assert check.matches and check.redone == 0 and check.resumed_at == 4


def test_a_run_that_never_restarted_does_not_count_as_a_resume(tmp_path: Path) -> None:
    straight = write_run(tmp_path / "run", attempts=[range(1, 13)], epochs=3)
    check = check_resume(straight, _reference(tmp_path))
    assert not check.restarted and not check.matches
