"""``Run(profile=...)`` / ``run.profile()``: traces per rank, and where each step's time went."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import Dataset

import paratrain as pt
from paratrain.profiling.step_profiler import Profile, as_profile
from paratrain.profiling.summary import PARTS, summarize
from tests.support.distributed import run_distributed

# -- the summary of a trace (synthetic traces: each label's rule on its own) -------------------


def op(name: str, ts: float, dur: float, tid: int = 1, cat: str = "cpu_op", **args: Any) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat, "args": args}


def step(number: int, ts: float, dur: float) -> dict:
    return op(f"ProfilerStep#{number}", ts, dur, cat="user_annotation")


def test_cpu_view_labels_each_instant_once() -> None:
    trace = {
        "traceEvents": [
            step(4, 0, 100),
            op("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 20),
            op("aten::stack", 5, 10),  # collate, inside the data wait
            op("DistributedDataParallel.forward", 20, 30, cat="user_annotation"),
            op("gloo:broadcast", 22, 3),  # the main thread blocked in a collective
            op("aten::addmm", 55, 10),
            op("gloo:all_reduce", 60, 20, tid=2),  # gloo's worker: 5 µs hidden, 15 exposed
            op("Optimizer.step#AdamW.step", 80, 15, cat="user_annotation"),
            op("aten::add_", 82, 5),
        ]
    }  # fmt: skip
    s = summarize(trace, rank=3)
    assert (s.rank, s.first_step, s.last_step, s.device) == (3, 4, 4, "cpu")
    assert s.step_ms == pytest.approx(0.1)
    expected = {"data wait": 20, "compute": 27 + 10, "communication": 3 + 15, "optimizer": 15}
    expected["idle"] = 100 - sum(expected.values())
    assert s.parts_ms == pytest.approx({k: v / 1000 for k, v in expected.items()})
    assert s.overlapped_communication_ms == pytest.approx(0.005)


def test_gpu_view_follows_the_kernels() -> None:
    launch = {"cat": "cuda_runtime", "tid": 1}
    trace = {
        "traceEvents": [
            step(0, 0, 100),
            step(1, 100, 100),
            op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, 30),
            op("Optimizer.step#SGD.step", 150, 40, cat="user_annotation"),
            {**op("cudaLaunchKernel", 151, 1, correlation=7), **launch},
            {**op("cudaLaunchKernel", 40, 1, correlation=3), **launch},
            op("gemm", 20, 40, tid=7, cat="kernel", correlation=3),  # data wait hidden
            op("ncclDevKernel_AllReduce_Sum_f32", 50, 30, tid=8, cat="kernel"),  # 20 exposed
            op("multi_tensor_apply_kernel", 160, 10, tid=7, cat="kernel", correlation=7),
        ]
    }  # fmt: skip
    s = summarize(trace)
    assert s.device == "cuda" and (s.first_step, s.last_step) == (0, 1)
    total = {"compute": 40, "communication": 20, "data wait": 20, "optimizer": 10 + 30}
    total["idle"] = 200 - sum(total.values())
    assert s.parts_ms == pytest.approx({k: v / 2 / 1000 for k, v in total.items()})
    assert s.overlapped_communication_ms == pytest.approx(10 / 2 / 1000)


def test_a_trace_without_steps_is_named() -> None:
    with pytest.raises(ValueError, match="ProfilerStep"):
        summarize({"traceEvents": [op("aten::mm", 0, 5)]})


spans = st.lists(
    st.tuples(
        st.sampled_from(["aten::mm", "gloo:all_reduce", "Optimizer.step#SGD.step",
                         "enumerate(DataLoader)#x", "paratrain: batch to device"]),
        st.integers(0, 150), st.integers(0, 80), st.integers(1, 2),
    ),
    max_size=25,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(spans, st.integers(1, 3))
def test_parts_always_add_up_to_the_steps(events: list[tuple[str, int, int, int]], n: int) -> None:
    trace = {
        "traceEvents": [step(i, 60 * i, 60) for i in range(n)]
        + [op(name, ts, dur, tid=tid) for name, ts, dur, tid in events]
    }
    s = summarize(trace)
    assert all(v >= 0 for v in s.parts_ms.values()) and set(s.parts_ms) == set(PARTS)
    assert sum(s.parts_ms.values()) == pytest.approx(s.step_ms) == pytest.approx(0.06)
    busy = [(ts, ts + dur) for _, ts, dur, _ in events if dur]
    if not any(ts < 60 * n and end > 0 for ts, end in busy):
        assert s.parts_ms["idle"] == pytest.approx(s.step_ms)


# -- the setting -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "must be True, a pt.Profile"),
        ({"wait": 1, "actve": 3}, "unknown field.*'actve'"),
        ({"active": 0}, "active must be an integer from 1"),
        ({"wait": -1}, "wait must be an integer from 0"),
        ({"warmup": True}, "warmup must be an integer"),
        ({"with_stack": "no"}, "with_stack must be True or False"),
    ],
)
def test_bad_profile_settings_name_the_fix(value: object, message: str) -> None:
    with pytest.raises(pt.ConfigError, match=message):
        pt.RunConfig(profile=value)  # type: ignore[arg-type]


def test_profile_settings() -> None:
    assert as_profile(True) == Profile() == Profile(wait=5, warmup=1, active=3)
    assert as_profile(False) is None and as_profile(None) is None
    assert as_profile({"active": 2}) == Profile(active=2)


class _Slow(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample takes ``sleep_s`` to load: a known data wait per step."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.sleep_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 4, (), generator=g)


def _train(
    run_dir: str, steps: int, window: Any, sleep_s: float, later: dict[str, int] | None = None
) -> dict[str, Any]:
    """Train ``steps`` steps with a profile window; the wall time of each step as the loop saw
    it (from the end of one ``run.step`` to the end of the next)."""
    with pt.Run(profile=window, run_dir=run_dir, progress=False) as run:
        net = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 4))
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters()))
        loader = run.loader(_Slow(sleep_s), batch_size=8)
        walls: dict[int, float] = {}
        last = time.perf_counter()
        while run.global_step < steps:
            for x, y in loader:
                with run.accumulate(model):
                    run.backward(nn.functional.cross_entropy(model(x), y))
                run.step(opt)
                now = time.perf_counter()
                walls[run.global_step] = now - last
                last = now
                if later is not None and run.global_step == later["at"]:
                    run.profile(wait=0, warmup=1, active=later["active"])
                if run.global_step == steps:
                    break
        return {"walls": walls, "world": run.world_size}


def _summary(run_dir: Path, rank: int, first: int, last: int) -> dict[str, Any]:
    stem = run_dir / "profile" / f"rank{rank}.steps-{first}-{last}"
    trace = json.loads(stem.with_name(stem.name + ".pt.trace.json").read_text())
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert sum(n.startswith("ProfilerStep#") for n in names) == last - first + 1
    assert any(n.startswith("aten::") for n in names)
    summary: dict[str, Any] = json.loads(stem.with_name(stem.name + ".summary.json").read_text())
    assert summary["steps"] == [first, last] and summary["rank"] == rank
    spans = sorted(
        (e["ts"], e["dur"]) for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")
    )
    summary["spans_ms"] = [dur / 1000 for _, dur in spans]
    return summary


def test_one_process_profile_and_a_window_never_reached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _train(str(tmp_path / "a"), 4, {"wait": 0, "warmup": 1, "active": 2}, 0.0)
    summary = _summary(tmp_path / "a", 0, 2, 3)
    assert sum(summary["parts_ms"].values()) == pytest.approx(summary["step_ms"], rel=1e-6)
    out = capsys.readouterr()
    assert "profile of steps 2-3 (2 steps, cpu view)" in out.out
    _train(str(tmp_path / "b"), 2, True, 0.0)  # the default window records steps 7-9
    err = capsys.readouterr().err
    assert (
        "the profile window (recording steps 7-9) did not finish: the run stopped 2 step(s) "
        "into the 9 it needs"
        in err
        and "wait=0, warmup=1, active=1" in err
    )
    assert not (tmp_path / "b" / "profile").exists()


def _profile_two_ranks(run_dir: str) -> dict[str, Any]:
    first = _train(run_dir + "/first", 6, {"wait": 1, "warmup": 1, "active": 3}, 0.002)
    later = _train(run_dir + "/later", 5, None, 0.0, later={"at": 2, "active": 2})
    return {"first": first, "later": later}


@pytest.mark.dist
def test_two_ranks_write_a_trace_each_and_the_parts_match_the_loop(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    results = run_distributed(_profile_two_ranks, 2, str(tmp_path))
    printed = capfd.readouterr().out
    assert printed.count("profile of steps 3-5 (3 steps, cpu view)") == 1  # the main process
    assert printed.count("profile of steps 4-5 (2 steps, cpu view)") == 1  # run.profile()
    for rank in (0, 1):
        summary = _summary(tmp_path / "first", rank, 3, 5)
        parts, step_ms = summary["parts_ms"], summary["step_ms"]
        assert sum(parts.values()) == pytest.approx(step_ms, rel=1e-6)
        # The trace's steps against the loop's own clock, on steps 3 and 4 (the loop's clock
        # of step 5 also holds writing the trace): within 10 %.
        walls = results[rank]["first"]["walls"]
        traced, loop = sum(summary["spans_ms"][:2]), 1000 * (walls[3] + walls[4])
        assert traced == pytest.approx(loop, rel=0.10), (traced, loop)
        assert step_ms == pytest.approx(sum(summary["spans_ms"]) / 3)
        # 8 samples of 2 ms sleep each: at least 16 ms of data wait per step.
        assert parts["data wait"] >= 16 * 0.95
        assert parts["communication"] > 0 and parts["optimizer"] > 0 and parts["compute"] > 0
        _summary(tmp_path / "later", rank, 4, 5)


def test_a_profiler_of_your_own_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with torch.profiler.profile() as own:
        _train(str(tmp_path), 3, {"wait": 0, "warmup": 1, "active": 1}, 0.0)
    assert "a torch.profiler session of your own is running" in capsys.readouterr().err
    assert len(own.events()) > 0 and not (tmp_path / "profile").exists()


def test_run_profile_refuses_a_second_window_and_bad_fields(tmp_path: Path) -> None:
    with pt.Run(run_dir=str(tmp_path), progress=False) as run:
        run.profile(active=2)
        with pytest.raises(pt.ConfigError, match="already armed"):
            run.profile()
    with pt.Run(run_dir=str(tmp_path), progress=False) as run:
        with pytest.raises(pt.ConfigError, match=r"unknown field.*'shapes'"):
            run.profile(shapes=True)
        with pytest.raises(pt.ConfigError, match="active must be an integer"):
            run.profile(active=0)
    with pytest.raises(pt.ConfigError, match="the run is closed"):
        run.profile()
