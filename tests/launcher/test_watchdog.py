"""The watchdog's verdict on synthetic stacks: the user's frame, and who waits for whom."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from traceback import FrameSummary

import pytest

from paratrain.distributed.watchdog import CodeRoots, Watchdog, diagnose, judge

ROOTS = CodeRoots(
    torch="/env/site-packages/torch",
    paratrain="/src/paratrain",
    libraries=("/usr/lib/python3.11", "/env/site-packages"),
)
TRAIN = "/home/me/project/train.py"


def _stack(*frames: tuple[str, int, str]) -> list[FrameSummary]:
    return [FrameSummary(path, line, name, line=None) for path, line, name in frames]


SAVE_ON_RANK_0 = _stack(
    ("/usr/lib/python3.11/runpy.py", 88, "_run_code"),
    (TRAIN, 20, "<module>"),
    ("/src/paratrain/run.py", 425, "save"),
    ("/src/paratrain/checkpointing.py", 80, "save"),
    ("/src/paratrain/collectives.py", 40, "named_barrier"),
    ("/env/site-packages/torch/distributed/c10d_logger.py", 81, "wrapper"),
    ("/env/site-packages/torch/distributed/distributed_c10d.py", 4500, "monitored_barrier"),
)


def test_a_collective_called_on_one_rank_names_the_users_line() -> None:
    verdict = judge(SAVE_ON_RANK_0, ROOTS)
    assert verdict.short == "train.py:20" and verdict.where == f"{TRAIN}:20 in <module>"
    assert verdict.call == "run.save"
    assert verdict.waiting and verdict.waiting_in_torch


def test_user_code_stuck_in_the_standard_library_is_not_waiting() -> None:
    verdict = judge(
        _stack((TRAIN, 18, "<module>"), ("/usr/lib/python3.11/threading.py", 320, "wait")), ROOTS
    )
    assert verdict.short == "train.py:18" and verdict.call == "threading.wait"
    assert not verdict.waiting and not verdict.waiting_in_torch


def test_paratrain_frames_do_not_count_as_torch() -> None:
    busy = judge(
        _stack(
            (TRAIN, 12, "main"),
            ("/src/paratrain/run.py", 190, "loader"),
            ("/src/paratrain/data.py", 300, "make_loader"),
        ),
        ROOTS,
    )
    assert busy.call == "run.loader" and not busy.waiting and not busy.waiting_in_torch
    polling = judge(
        _stack(
            (TRAIN, 30, "main"),
            ("/src/paratrain/run.py", 370, "barrier"),
            ("/src/paratrain/collectives.py", 60, "_poll"),
        ),
        ROOTS,
    )
    assert polling.call == "run.barrier" and polling.waiting and not polling.waiting_in_torch


def test_a_torch_call_is_named_past_its_decorator() -> None:
    verdict = judge(
        _stack(
            (TRAIN, 40, "train_step"),
            ("/env/site-packages/torch/distributed/c10d_logger.py", 81, "wrapper"),
            ("/env/site-packages/torch/distributed/distributed_c10d.py", 2800, "all_reduce"),
        ),
        ROOTS,
    )
    assert verdict.call == "torch.distributed.distributed_c10d.all_reduce" and verdict.waiting


def test_no_user_frame_and_no_stack() -> None:
    inner = judge(_stack(("/src/paratrain/commands/demo/train.py", 50, "train")), ROOTS)
    assert inner.short == "train.py:50" and inner.call is None and not inner.waiting
    assert judge([], ROOTS).where == "?"


@pytest.mark.parametrize(
    "path,kind",
    [
        (TRAIN, "user"),
        ("/home/me/paratrain/train.py", "user"),  # a project folder named like the package
        ("/env/site-packages/torch/nn/modules/module.py", "torch"),
        ("/src/paratrain/run.py", "paratrain"),
        ("/env/site-packages/tqdm/std.py", "library"),
        ("/opt/conda/lib/python3.11/dist-packages/numpy/core.py", "library"),
        ("/usr/lib/python3.11/queue.py", "library"),
        ("<frozen importlib._bootstrap>", "library"),
    ],
)
def test_whose_code_a_file_is(path: str, kind: str) -> None:
    assert ROOTS.kind(path) == kind


def _write(folder: Path, *records: dict[str, object]) -> None:
    for record in records:
        (folder / f"rank{record['rank']}.json").write_text(json.dumps(record))


def test_diagnose_when_every_rank_waits_in_a_different_collective(tmp_path: Path) -> None:
    common = {"waiting_in_torch": True, "waiting": True, "step": 5, "where": TRAIN}
    _write(
        tmp_path,
        {"rank": 0, "short": "train.py:20", "call": "run.save", **common},
        {"rank": 1, "short": "train.py:16", "call": "run.backward", **common},
    )
    result = diagnose(tmp_path)
    assert result is not None and result["stalled"] == [0, 1]
    assert result["summary"].startswith(
        "rank 0 at step 5: train.py:20 (in run.save, waiting for the other ranks); "
        "rank 1 at step 5: train.py:16 (in run.backward, waiting for the other ranks)"
    )
    assert "called on some ranks only" in result["summary"]


def test_diagnose_names_the_rank_that_is_not_waiting(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {"rank": 0, "step": 5, "waiting_in_torch": True, "waiting": True, "call": "run.step",
         "where": TRAIN, "short": "train.py:17"},
        {"rank": 1, "step": 5, "waiting_in_torch": False, "waiting": False, "call": None,
         "where": TRAIN, "short": "train.py:20"},
    )  # fmt: skip
    result = diagnose(tmp_path)
    assert result is not None and result["summary"] == "rank 1 at step 5: train.py:20"
    assert diagnose(tmp_path / "nothing") is None


def test_records_of_the_old_format_still_read(tmp_path: Path) -> None:
    _write(tmp_path, {"rank": 0, "step": 2, "waiting_in_torch": False, "where": "t.py:3 in f"})
    result = diagnose(tmp_path)
    assert result is not None and result["summary"] == "rank 0 at step 2: t.py:3 in f"


def test_a_real_dump_judges_the_main_thread(tmp_path: Path) -> None:
    """The dump looks at the main thread (where the loop runs), not the watchdog's own."""
    dog = Watchdog(tmp_path, rank=3, after_s=3600, exit_after_dump=False)
    try:
        box: list[Path] = []
        worker = threading.Thread(target=lambda: box.append(dog.dump(idle=12.0)))
        worker.start()
        worker.join()
    finally:
        dog.stop()
    record = json.loads(box[0].read_text())
    assert record["rank"] == 3 and record["short"].startswith("test_watchdog.py:")
    assert (
        record["waiting"] is False
        and "rank 3: no progress for 12s" in (tmp_path / "rank3.txt").read_text()
    )
