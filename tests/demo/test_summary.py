"""The demo's verdict: a short run that misses the target is said plainly and exits 0; a default
run below the target, or a resume that differs, exits 1."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from paratrain.commands.demo.artefacts import DemoFiles
from paratrain.commands.demo.resume_check import ResumeCheck
from paratrain.commands.demo.summary import Outcome, Phase, render

MATCH = ResumeCheck(
    restarted=True,
    crashed_after=149,
    resumed_at=138,
    redone_equal=True,
    steps=276,
    first_difference=None,
    weights_max_diff=0.0,
    weights_equal=True,
)


def _outcome(accuracy: float, *, epochs: int = 12, **changes: Any) -> Outcome:
    trained = {
        "strategy": "ddp",
        "world_size": 2,
        "device": "cpu",
        "steps": 23 * epochs,
        "test_samples": 359,
        "test_accuracy": accuracy,
    }
    outcome = Outcome(
        files=DemoFiles(Path("runs/demo/x")),
        trained=trained,
        reloaded={"test_accuracy": accuracy, "test_samples": 359},
        epochs=epochs,
        train_seconds=2.5,
        resume=MATCH,
        crash_epoch=7,
        phases=[Phase("training job", 16.0, "ranks starting 6.0 s"), Phase("plot", 1.0)],
    )
    return replace(outcome, **changes)


def _render(outcome: Outcome) -> tuple[str, int]:
    return render(outcome, target=0.95, default_epochs=12)


def test_the_default_run_reaching_the_target_is_ok() -> None:
    text, code = _render(_outcome(0.9777))
    assert code == 0
    assert "result       OK: test accuracy 0.9777 reaches the target 0.95" in text
    assert "276 steps in 2.5 s" in text and "17.0 s in all, 2.5 s of it training" in text
    assert "training job 16.0 s (ranks starting 6.0 s)" in text


def test_too_few_epochs_is_said_plainly_and_is_not_a_failure() -> None:
    text, code = _render(_outcome(0.8412, epochs=2))
    assert code == 0
    assert "2 epochs were too few to reach the target 0.95 (test accuracy 0.8412)" in text
    assert "The default, 12 epochs, reaches it: run `paratrain demo` without --epochs" in text
    assert "BELOW" not in text


def test_one_epoch_reads_as_one() -> None:
    text, code = _render(_outcome(0.5, epochs=1, resume=None, resume_skipped="one epoch"))
    assert code == 0 and "1 epoch was too few to reach the target" in text
    assert "1 epochs" not in text and "resume       not shown (one epoch)" in text


def test_the_default_epochs_below_the_target_is_a_failure() -> None:
    text, code = _render(_outcome(0.90))
    assert code == 1 and "BELOW: test accuracy 0.9000 after 12 epochs" in text


def test_the_lower_of_the_two_accuracies_decides() -> None:
    outcome = _outcome(0.97)
    outcome = replace(outcome, reloaded={"test_accuracy": 0.94, "test_samples": 359})
    assert _render(outcome)[1] == 1


def test_an_exact_resume_is_reported_with_its_steps() -> None:
    text, _ = _render(_outcome(0.9777))
    assert "rank 1 killed in epoch 7 after step 149" in text
    assert "resumed from the checkpoint of step 138" in text
    assert "the 11 steps run twice gave the same losses both times, bit for bit" in text
    assert "all 276 step losses and the final weights equal those of an uninterrupted run" in text


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"first_difference": 150}, "losses differ from step 150, final weights equal"),
        ({"weights_equal": False, "weights_max_diff": 3e-8}, "final weights differ by up to 3e-08"),
        ({"redone_equal": False}, "gave DIFFERENT losses the second time"),
        ({"restarted": False}, "no restart happened"),
        ({"resumed_at": 149, "first_difference": 1}, "no step ran twice"),
    ],
)
def test_a_resume_that_differs_fails_and_says_where(changes: dict[str, Any], needle: str) -> None:
    text, code = _render(_outcome(0.9777, resume=replace(MATCH, **changes)))
    assert code == 1 and needle in text
    assert "result       DIFFERS" in text


def test_a_skipped_resume_says_why() -> None:
    text, code = _render(_outcome(0.9777, resume=None, resume_skipped="--skip-resume"))
    assert code == 0 and "resume       not shown (--skip-resume)" in text
    assert "both attempts" not in text
