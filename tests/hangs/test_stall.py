"""Naming a hang from every rank's published state, and the collective log that feeds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from paratrain.commands.run import failure
from paratrain.distributed.collective_log import CollectiveLog
from paratrain.distributed.stall import MIN_STALL_S, StallMonitor, name_cause

LEFT_EARLY = """[rank0]: RuntimeError: Connection reset by peer
[rank2]: RuntimeError: Connection reset by peer
Failures:
[1]:
  time      : t
  host      : box
  rank      : 2 (local_rank: 2)
  exitcode  : 1 (pid: 12)
Root Cause (first observed failure):
[0]:
  time      : t
  host      : box
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 11)
"""


def _in(rank: int, seq: int, op: str, where: str, shapes: str = "f32[4]", group: str = "default",
        step: int = 2) -> dict[str, Any]:  # fmt: skip
    entry = {"seq": seq, "op": op, "shapes": shapes, "group": 2, "group_name": group,
             "where": where, "started": 0.0}  # fmt: skip
    return {"rank": rank, "step": step, "seq": seq, "inside": True, "collective": entry,
            "where": where, "call": f"torch.distributed.{op}", "waiting": True,
            "place": "", "same_s": 40.0}  # fmt: skip


def _out(rank: int, where: str, place: str, same_s: float, step: int = 2) -> dict[str, Any]:
    return {"rank": rank, "step": step, "seq": 2, "inside": False, "collective": None,
            "where": where, "call": None, "waiting": False, "place": place,
            "same_s": same_s}  # fmt: skip


def test_mismatched_collectives_name_each_rank_and_line() -> None:
    cause = name_cause({0: _in(0, 57, "all_reduce", "train.py:88"),
                        1: _in(1, 57, "broadcast", "train.py:93")})  # fmt: skip
    assert cause is not None and cause["kind"] == "mismatched collectives"
    assert "rank 0 in all_reduce #57 of f32[4] at train.py:88" in cause["summary"]
    assert "rank 1 in broadcast #57 of f32[4] at train.py:93" in cause["summary"]
    skipped = name_cause({0: _in(0, 58, "all_reduce", "train.py:88"),
                          1: _in(1, 57, "all_reduce", "train.py:88")})  # fmt: skip
    assert skipped is not None and skipped["kind"] == "mismatched collectives"
    assert skipped["ranks"] == [1]


def test_shapes_and_process_groups() -> None:
    shapes = name_cause({0: _in(0, 5, "all_reduce", "t.py:1", "f32[4]"),
                         1: _in(1, 5, "all_reduce", "t.py:1", "f32[6]")})  # fmt: skip
    assert shapes is not None and shapes["kind"] == "shape mismatch"
    groups = name_cause({0: _in(0, 5, "all_reduce", "t.py:1", group="1"),
                         1: _in(1, 5, "all_reduce", "t.py:1", group="2")})  # fmt: skip
    assert groups is not None and groups["kind"] == "two process groups"
    same = name_cause({0: _in(0, 5, "all_reduce", "t.py:1"), 1: _in(1, 5, "all_reduce", "t.py:1")})
    assert same is not None and same["kind"] == "collective does not complete"


def test_a_rank_that_never_reached_is_named_with_where_it_is_stuck() -> None:
    cause = name_cause({0: _in(0, 3, "all_reduce", "train.py:67"),
                        1: _out(1, "train.py:72", "in its own code (a loop that does not end?)",
                                same_s=35.0)})  # fmt: skip
    assert cause is not None and cause["kind"] == "never reached" and cause["ranks"] == [1]
    assert (
        "rank 1 is in its own code (a loop that does not end?) at train.py:72" in cause["summary"]
    )
    assert "rank 0 in all_reduce #3 of f32[4] at train.py:67" in cause["summary"]


def test_a_rank_still_moving_is_busy_not_stuck() -> None:
    busy = {0: _in(0, 3, "barrier", "train.py:50"), 1: _out(1, "eval.py:12", "", same_s=0.5)}
    assert name_cause(busy) is None


def test_the_threshold_adapts_to_the_step_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("paratrain.distributed.stall.time.monotonic", lambda: clock[0])
    monitor = StallMonitor(None, rank=0, world_size=2, log=CollectiveLog(0))
    assert monitor.threshold() == MIN_STALL_S  # no step yet
    for step in range(6):  # steps of 2 s, several progress calls each
        monitor.note_step(step)
        monitor.note_step(step)
        clock[0] += 2.0
    assert monitor.threshold() == pytest.approx(40.0)  # 20 x the 2 s steps
    clock[0] += 60.0  # one slow step of 62 s: the p99 follows it
    monitor.note_step(6)
    assert monitor.threshold() == pytest.approx(20 * 62.0)
    fixed = StallMonitor(None, rank=0, world_size=2, log=CollectiveLog(0), stall_s=5.0)
    assert fixed.threshold() == 5.0


@pytest.fixture
def one_rank(tmp_path: Path) -> Any:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_log_records_the_outermost_collective_and_its_line(one_rank: Any) -> None:
    original = dist.all_reduce
    log = CollectiveLog(0).install()
    try:
        assert dist.all_reduce is not original
        dist.all_reduce(torch.ones(3, 2))
        line = test_the_log_records_the_outermost_collective_and_its_line.__code__.co_firstlineno
        state = log.state()
        assert state["seq"] == 1 and not state["inside"]
        assert state["collective"]["op"] == "all_reduce"
        assert state["collective"]["shapes"] == "f32[3, 2]"
        assert state["collective"]["where"].startswith("test_stall.py:")
        assert int(state["collective"]["where"].split(":")[1]) > line
        gathered: list[Any] = [None]
        dist.all_gather_object(gathered, {"a": 1})  # calls all_gather inside: one record
        assert log.seq == 2 and log.last is not None and log.last.op == "all_gather_object"
    finally:
        log.uninstall()
    assert dist.all_reduce is original


def test_where_a_rank_is_stuck_is_read_from_its_innermost_frames() -> None:
    from traceback import FrameSummary

    from paratrain.distributed.stall import _kind_of_place

    def at(file: str, line: str) -> list[FrameSummary]:
        return [
            FrameSummary("train.py", 1, "<module>", line="main()"),
            FrameSummary(file, 9, "f", line=line),
        ]

    assert _kind_of_place(at("train.py", "n += 1")).startswith("in its own code")
    assert _kind_of_place(at("train.py", "lock.acquire()")).startswith("blocked")
    assert _kind_of_place(at("train.py", "time.sleep(3600)")).startswith("blocked")
    assert _kind_of_place(at("/usr/lib/python3.11/queue.py", "self.not_empty.wait()")).startswith(
        "blocked"
    )
    loader = at(
        "/venv/site-packages/torch/utils/data/dataloader.py", "idx, data = self._get_data()"
    )
    assert _kind_of_place(loader).startswith("in the data loader")


def test_a_recorded_collective_against_ddps_backward_is_a_mismatch() -> None:
    backward = _out(1, "train.py:101", "", same_s=40.0) | {"waiting": True, "call": "run.backward"}
    cause = name_cause({0: _in(0, 3, "barrier", "train.py:87"), 1: backward})
    assert cause is not None and cause["kind"] == "mismatched collectives"
    assert "rank 0 in barrier #3" in cause["summary"]
    assert "rank 1 at train.py:101 (in run.backward)" in cause["summary"]
    both = name_cause({0: backward | {"rank": 0}, 1: backward})
    assert both is not None and both["kind"] == "collective does not complete"


def test_a_shape_mismatch_some_ranks_passed_is_still_named() -> None:
    """gloo at 4 ranks can complete a ring on the ranks with the smaller tensor: they move on to
    backward, the odd rank stays in the collective."""
    passed = _in(0, 3, "all_reduce", "train.py:73") | {"inside": False, "call": "run.backward"}
    states = {r: passed | {"rank": r} for r in (0, 2, 3)}
    states[1] = _in(1, 3, "all_reduce", "train.py:73", shapes="f32[6]")
    cause = name_cause(states)
    assert cause is not None and cause["kind"] == "shape mismatch" and cause["ranks"] == [1]
    assert (
        "all_reduce #3 at train.py:73: rank(s) 0, 2, 3: f32[4]; rank(s) 1: f32[6]"
        in cause["summary"]
    )
    scatter = {0: _in(0, 4, "scatter", "t.py:1", shapes="f32[4], f32[4]"),
               1: _in(1, 4, "scatter", "t.py:1", shapes="")}  # fmt: skip
    named = name_cause(scatter)
    assert named is not None and named["kind"] != "shape mismatch"


def test_ranks_that_only_lost_their_peer_name_an_early_exit() -> None:
    """Rank 1 left the loop (exit 0, so not in torchrun's report); ranks 0 and 2 lost it."""
    text = failure.failure_message(1, LEFT_EARLY, None, 0)
    assert "rank 0 lost its peer in a collective, and no rank failed on its own" in text
    assert "an early stop decided on one rank's own metric" in text
    own = LEFT_EARLY.replace(
        "[rank2]: RuntimeError: Connection reset by peer", "[rank2]: ValueError: bad"
    )
    assert "lost its peer" not in failure.failure_message(1, own, None, 0)


class _Store:
    """The two calls of the job's store the monitor reads and writes."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes:
        return self.data[key].encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)


def test_a_rank_that_stopped_publishing_is_named_not_answering() -> None:
    import json
    import time

    store = _Store()
    now = time.time()
    store.set(
        "paratrain/stall/0", json.dumps(_in(0, 3, "all_reduce", "train.py:9") | {"time": now})
    )
    late = _in(1, 3, "all_reduce", "train.py:9") | {"time": now - 60}
    store.set("paratrain/stall/1", json.dumps(late))
    monitor = StallMonitor(store, rank=0, world_size=2, log=CollectiveLog(0), stall_s=1.0)
    cause = monitor.check(5.0, waiting=True)
    assert cause is not None and cause["kind"] == "never reached" and cause["ranks"] == [1]
    assert (
        "rank 1 is not answering (blocked in native code holding the GIL, or gone)"
        in (cause["summary"])
    )
    assert monitor.check(0.5, waiting=True) is None  # below the threshold: nothing compared
