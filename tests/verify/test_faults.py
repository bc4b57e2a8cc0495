"""The event trace and the kill point (PARATRAIN_TRACE, PARATRAIN_KILL)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from paratrain.core import faults
from paratrain.core.faults import KillPoint


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_events_are_counted_per_kind_with_the_loop_position(tmp_path: Path) -> None:
    position = [0, 0]
    recorder = faults.start(
        trace_dir=str(tmp_path), kill=None, rank=1, restart=2, where=lambda: tuple(position)
    )
    try:
        faults.emit("step")
        position[:] = [1, 0]
        faults.emit("saved")
        faults.emit("step")
    finally:
        faults.stop(recorder)
    faults.emit("step")  # stopped: nothing more is written
    assert _lines(tmp_path / "rank1.jsonl") == [
        {"event": "step", "n": 1, "step": 0, "epoch": 0, "rank": 1, "restart": 2},
        {"event": "saved", "n": 1, "step": 1, "epoch": 0, "rank": 1, "restart": 2},
        {"event": "step", "n": 2, "step": 1, "epoch": 0, "rank": 1, "restart": 2},
    ]


def test_nothing_is_recorded_without_the_variables() -> None:
    assert faults.start(trace_dir=None, kill=None, rank=0, restart=0, where=lambda: (0, 0)) is None
    faults.emit("step")  # a no-op


KILLER = """
import sys
from paratrain.core import faults
from paratrain.core.faults import KillPoint
faults.start(trace_dir=sys.argv[1], kill=KillPoint.parse(sys.argv[2]), rank=int(sys.argv[3]),
             restart=int(sys.argv[4]), where=lambda: (5, 1))
for _ in range(3):
    faults.emit("epoch")
print("finished")
"""


def _run(tmp_path: Path, kill: str, rank: int, restart: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", KILLER, str(tmp_path), kill, str(rank), str(restart)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_the_rank_kills_itself_at_its_nth_event_after_recording_it(tmp_path: Path) -> None:
    proc = _run(tmp_path, "epoch:2:0", rank=0, restart=0)
    assert proc.returncode == -signal.SIGKILL
    assert "finished" not in proc.stdout
    assert [e["n"] for e in _lines(tmp_path / "rank0.jsonl")] == [1, 2]


def test_other_ranks_and_restarted_attempts_are_not_killed(tmp_path: Path) -> None:
    assert _run(tmp_path / "a", "epoch:2:1", rank=0, restart=0).returncode == 0
    assert _run(tmp_path / "b", "epoch:2:0", rank=0, restart=1).returncode == 0
    assert len(_lines(tmp_path / "b" / "rank0.jsonl")) == 3


def test_kill_point_text_is_what_the_variable_holds() -> None:
    assert str(KillPoint("mid_window", 4, 1)) == "mid_window:4:1"


def test_a_preemption_point_sends_sigterm_at_the_nth_step(tmp_path: Path) -> None:
    stepper = KILLER.replace('faults.emit("epoch")', 'faults.emit("step")')
    argv = [sys.executable, "-c", stepper, str(tmp_path), "preempt:2:0", "0", "0"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM  # no handler here: the signal ends the process
    assert [e["n"] for e in _lines(tmp_path / "rank0.jsonl")] == [1, 2]
