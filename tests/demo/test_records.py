"""Reading the demo's metrics.jsonl: attempts split at a restart, epochs once, training time."""

from __future__ import annotations

from pathlib import Path

import pytest

from paratrain.commands.demo.records import job_breakdown, read_records
from tests.demo.fake_runs import loss_at, write_run


def test_one_attempt(tmp_path: Path) -> None:
    files = write_run(tmp_path, attempts=[range(1, 13)], epochs=3)
    records = read_records(files.metrics, files.restarts)
    assert [e.epoch for e in records.epochs] == [1, 2, 3]
    assert records.epochs[-1].accuracy == pytest.approx(0.6)
    assert len(records.attempts) == 1 and records.redone_steps() == []
    assert records.final_losses() == {s: loss_at(s) for s in range(1, 13)}
    assert records.train_seconds == pytest.approx(0.75)
    assert records.spans == [(1001.0, 1012.0)]


def test_a_restart_starts_a_new_attempt_and_its_redone_steps_are_known(tmp_path: Path) -> None:
    # Crashed after step 6 (in epoch 2), resumed from the checkpoint of step 4.
    files = write_run(tmp_path, attempts=[range(1, 7), range(5, 13)], epochs=3)
    records = read_records(files.metrics, files.restarts)
    assert [sorted(a) for a in records.attempts] == [list(range(1, 7)), list(range(5, 13))]
    assert records.redone_steps() == [5, 6]
    assert [e.epoch for e in records.epochs] == [1, 2, 3]  # each epoch once
    assert records.train_seconds == pytest.approx(0.75)  # the epochs that ended, in any attempt
    assert records.spans == [(1001.0, 1006.0), (1007.5, 1014.5)]
    assert records.resumed_at == [4]


def test_a_restart_right_after_a_checkpoint_is_still_a_restart(tmp_path: Path) -> None:
    # Killed before the first step of epoch 2: the steps do not go back, the restart's line
    # still says where the second attempt began.
    files = write_run(tmp_path, attempts=[range(1, 5), range(5, 13)], epochs=3)
    records = read_records(files.metrics, files.restarts)
    assert [sorted(a) for a in records.attempts] == [list(range(1, 5)), list(range(5, 13))]
    assert records.redone_steps() == [] and records.resumed_at == [4]


def test_without_restarts_jsonl_it_is_one_attempt(tmp_path: Path) -> None:
    files = write_run(tmp_path, attempts=[range(1, 13)], epochs=3)
    assert not files.restarts.exists()
    records = read_records(files.metrics, files.restarts)
    assert len(records.attempts) == 1 and records.resumed_at == []


def test_lines_that_are_not_the_demos_are_skipped(tmp_path: Path) -> None:
    files = write_run(tmp_path, attempts=[range(1, 5)], epochs=1)
    with files.metrics.open("a") as out:
        out.write('\n{"step": 4, "time": 1.0, "custom/thing": 3.0}\n')
    records = read_records(files.metrics, files.restarts)
    assert len(records.epochs) == 1 and len(records.attempts) == 1


def test_the_job_breakdown_adds_up_to_the_job(tmp_path: Path) -> None:
    files = write_run(tmp_path, attempts=[range(1, 7), range(5, 13)], epochs=3, start=1000.0)
    records = read_records(files.metrics, files.restarts)
    parts = dict(job_breakdown(records, launched=995.0, ended=1020.0))
    assert sum(parts.values()) == pytest.approx(25.0)
    starting = next(v for k, v in parts.items() if k.startswith("ranks starting"))
    restart = next(v for k, v in parts.items() if k.startswith("restart"))
    assert starting == pytest.approx(6.0) and restart == pytest.approx(1.5)
    assert parts["training"] == pytest.approx(0.75)


def test_a_job_that_logged_nothing_is_one_part(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    records = read_records(tmp_path / "metrics.jsonl", tmp_path / "restarts.jsonl")
    assert job_breakdown(records, launched=0.0, ended=3.0) == [("the whole job", 3.0)]
