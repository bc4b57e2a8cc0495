"""Kill points: the PARATRAIN_KILL format, reading traces, and which points are chosen."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paratrain.commands.verify.kill_points import KINDS, Event, choose, read_trace, spread
from paratrain.core.faults import EVENTS, KillPoint
from paratrain.distributed.environment import LaunchEnv
from paratrain.errors import ConfigError


def test_kill_point_round_trips_and_bad_values_name_the_format() -> None:
    point = KillPoint.parse("save_write:3:1")
    assert point == KillPoint("save_write", 3, 1)
    assert str(point) == "save_write:3:1"
    for bad in ("step", "step:0:1", "step:-1:0", "nope:1:0", "step:1:x", "step:1:0:2", ""):
        with pytest.raises(ConfigError, match="EVENT:N:RANK"):
            KillPoint.parse(bad)


def test_launch_env_reads_the_verify_variables() -> None:
    env = LaunchEnv.read(
        {
            "PARATRAIN_TRACE": "/t",
            "PARATRAIN_KILL": "epoch:2:0",
            "PARATRAIN_FINAL_STATE": "/f",
        }
    )
    assert (env.trace, env.kill, env.final_state) == ("/t", KillPoint("epoch", 2, 0), "/f")
    assert LaunchEnv.read({}).kill is None
    with pytest.raises(ConfigError, match="PARATRAIN_KILL='step:1'"):
        LaunchEnv.read({"PARATRAIN_KILL": "step:1"})


def test_read_trace_skips_lines_cut_short(tmp_path: Path) -> None:
    good = {"event": "step", "n": 1, "step": 1, "epoch": 0, "rank": 0, "restart": 0}
    (tmp_path / "rank0.jsonl").write_text(json.dumps(good) + "\n" + '{"event": "st')
    (tmp_path / "rank1.jsonl").write_text(json.dumps({**good, "rank": 1, "event": "other"}))
    assert read_trace(tmp_path) == [Event("step", 1, 1, 0, 0, 0)]
    assert read_trace(tmp_path / "missing") == []


def test_spread_starts_in_the_middle_and_ends_with_the_first() -> None:
    assert spread(1) == [0]
    assert spread(2) == [1, 0]
    assert spread(10)[:3] == [5, 2, 7]
    for count in range(1, 40):
        order = spread(count)
        assert sorted(order) == list(range(count))
        assert count == 1 or order[-1] == 0


def _trace(counts: dict[str, int], ranks: tuple[int, ...]) -> list[Event]:
    return [
        Event(kind, n, step=n, epoch=0, rank=rank, restart=0)
        for kind, count in counts.items()
        for rank in ranks
        for n in range(1, count + 1)
    ]


def test_kinds_come_in_priority_order_skipping_missing_ones() -> None:
    events = _trace({"epoch": 3, "step": 8, "saved": 3, "mid_window": 8}, ranks=(0,))
    chosen = choose(events, kills=4, world_size=1)
    assert [c.point.event for c in chosen] == ["mid_window", "step", "saved", "preempt"]
    # the middle occurrences; a preemption at another step than the step kill
    assert [c.point.n for c in chosen] == [5, 5, 2, 3]
    assert all(c.point.rank == 0 for c in chosen)


def test_more_kills_than_kinds_take_other_ordinals_and_stop_when_all_are_used() -> None:
    events = _trace({"step": 4, "epoch": 2}, ranks=(0,))
    chosen = choose(events, kills=5, world_size=1)
    assert [(c.point.event, c.point.n) for c in chosen] == [
        ("step", 3),
        ("preempt", 2),
        ("epoch", 2),
        ("step", 2),
        ("preempt", 4),
    ]
    assert len(choose(events, kills=50, world_size=1)) == 10  # every event once, steps twice


def test_ranks_alternate_and_a_kind_only_one_rank_has_goes_to_that_rank() -> None:
    events = _trace({"step": 6, "saved": 2, "epoch": 2}, ranks=(0, 1))
    events += _trace({"save_write": 2}, ranks=(0,))  # only the main process writes
    chosen = choose(events, kills=4, world_size=2)
    assert [(c.point.event, c.point.rank) for c in chosen] == [
        ("step", 1),
        ("saved", 0),
        ("save_write", 0),
        ("preempt", 1),
    ]


def test_a_preemption_kill_point_parses_and_sends_sigterm_at_its_step() -> None:
    assert KillPoint.parse("preempt:4:1") == KillPoint("preempt", 4, 1)


def test_events_of_a_restarted_attempt_are_not_kill_points() -> None:
    events = [Event("step", 1, 1, 0, 0, restart=1)]
    assert choose(events, kills=2, world_size=1) == []


def test_a_seed_draws_other_ordinals_reproducibly() -> None:
    events = _trace(dict.fromkeys(EVENTS, 20), ranks=(0,))
    default = choose(events, kills=7, world_size=1)
    drawn = choose(events, kills=7, world_size=1, seed=7)
    assert [c.point.event for c in drawn] == list(KINDS)
    assert drawn == choose(events, kills=7, world_size=1, seed=7)
    assert [c.point.n for c in drawn] != [c.point.n for c in default]
