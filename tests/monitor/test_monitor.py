"""``paratrain monitor`` on synthetic stats (each flag) and the stats the runtime writes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import paratrain as pt
from paratrain.commands.cli import main
from paratrain.commands.monitor.snapshot import flags, snapshot
from tests.support.training import dataset, mlp


def _write(run_dir: Path, records: list[dict[str, Any]]) -> Path:
    (run_dir / "stats").mkdir(parents=True)
    for r in records:
        base = {
            "time": time.time(),
            "pid": 2**22 + r["rank"],
            "step": 100,
            "step_time_s": 0.1,
            "samples_per_s": 320.0,
            "data_wait_fraction": 0.05,
            "peak_memory_mb": 1000.0,
            "device": "cpu",
        }
        line = json.dumps({**base, **r})
        (run_dir / "stats" / f"rank{r['rank']}.jsonl").write_text("{}\n" + line + "\n{partial")
    return run_dir


@pytest.mark.parametrize(
    "changes,flag,where",
    [
        ({"step_time_s": 0.25}, "straggler", "rank 2"),
        ({"data_wait_fraction": 0.5}, "input-bound", "rank 2"),
        ({"peak_memory_mb": 1900.0}, "memory imbalance", "rank 2"),
    ],
)
def test_each_flag(tmp_path: Path, changes: dict[str, float], flag: str, where: str) -> None:
    run_dir = _write(tmp_path, [{"rank": 0}, {"rank": 1}, {"rank": 2, **changes}])
    found = snapshot(run_dir)["flags"]
    assert [(f["flag"], f["where"]) for f in found] == [(flag, where)]
    assert found[0]["hint"]


def test_a_named_hang_is_a_flag(tmp_path: Path) -> None:
    run_dir = _write(tmp_path, [{"rank": 0}, {"rank": 1}])
    (run_dir / "stacks").mkdir()
    cause = {"kind": "mismatched collectives", "ranks": [1], "summary": "rank 0 in all_reduce #3"}
    (run_dir / "stacks" / "diagnosis.json").write_text(json.dumps(cause))
    (hang,) = [f for f in snapshot(run_dir)["flags"] if f["flag"].startswith("hang")]
    assert hang["flag"] == "hang: mismatched collectives" and hang["where"] == "rank 1"
    assert hang["detail"] == "rank 0 in all_reduce #3" and "stacks" in hang["hint"]


def test_healthy_job_and_idle_gpu(tmp_path: Path) -> None:
    run_dir = _write(tmp_path, [{"rank": 0}, {"rank": 1}])
    snap = snapshot(run_dir)
    assert snap["flags"] == [] and [r["rank"] for r in snap["ranks"]] == [0, 1]
    gpus = [
        {"index": 0, "utilization": 95, "memory_used_mb": 9000.0},
        {"index": 1, "utilization": 2, "memory_used_mb": 9000.0},
    ]
    idle = flags(snap["ranks"], gpus)
    assert [(f["flag"], f["where"]) for f in idle] == [("idle GPU", "GPU 1")]
    gpus[1] = {"index": 1, "utilization": 90, "memory_used_mb": 4000.0}
    assert [f["where"] for f in flags(snap["ranks"], gpus)] == ["GPU 0"]  # cuda:0 heavier


def test_cli_once_json_and_bad_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = _write(tmp_path / "job", [{"rank": 0}, {"rank": 1, "data_wait_fraction": 0.6}])
    assert main(["monitor", str(run_dir), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert snap["flags"][0]["flag"] == "input-bound"
    assert main(["monitor", str(run_dir), "--once"]) == 0
    out = capsys.readouterr().out
    assert "input-bound" in out and "exited" in out
    with pytest.raises(SystemExit) as info:
        main(["monitor", str(tmp_path / "nothing"), "--once"])
    assert info.value.code == 2 and "does not exist" in capsys.readouterr().err.replace("\n", " ")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as info:
        main(["monitor", str(tmp_path / "empty"), "--once"])
    assert info.value.code == 2 and "no stats/ folder" in capsys.readouterr().err.replace("\n", " ")


def test_missing_nvidia_ml_py_gets_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now fails
    run_dir = _write(tmp_path / "job", [{"rank": 0}])
    snap = snapshot(run_dir)
    assert snap["gpus"] == [] and "pip install 'paratrain[gpu]'" in snap["gpu_note"]
    assert main(["monitor", str(run_dir), "--once"]) == 0
    assert "pip install 'paratrain[gpu]'" in " ".join(capsys.readouterr().out.split())


def test_runtime_writes_stats(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", run_dir=tmp_path, stats_every=2, progress=False) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        for x, y in run.loader(dataset(40), batch_size=4):
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
    lines = (tmp_path / "stats" / "rank0.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [2, 4, 6, 8, 10]
    assert all(r["samples_per_s"] > 0 and 0 <= r["data_wait_fraction"] <= 1 for r in records)
    assert all(r["peak_memory_mb"] > 10 and r["step_time_s"] > 0 for r in records)


def test_a_run_never_closed_still_writes_its_last_stats(tmp_path: Path) -> None:
    """Records are kept in memory between writes; a script that ends without closing its run
    still writes them (at interpreter exit)."""
    import subprocess
    import textwrap

    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch, paratrain as pt
            run = pt.Run(strategy="cpu", run_dir={str(tmp_path / "run")!r}, stats_every=2,
                         progress=False)
            model = torch.nn.Linear(4, 1)
            model, opt = run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
            for _ in range(20):
                run.backward(model(torch.ones(2, 4)).sum())
                run.step(opt)
            """
        )
    )
    subprocess.run([sys.executable, str(script)], check=True, timeout=120, capture_output=True)
    lines = (tmp_path / "run" / "stats" / "rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(2, 21, 2))


def test_damaged_stats_lines_are_skipped(tmp_path: Path) -> None:
    from paratrain.commands.monitor.snapshot import latest_records

    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "rank0.jsonl").write_text(
        '{"rank": 0, "step": 3}\n[1, 2]\n"text"\n{"step": 9}\n{bad\n'
    )
    (stats / "rank1.jsonl").write_text("null\n")
    assert latest_records(tmp_path) == [{"rank": 0, "step": 3}]


STATS_LINE = st.fixed_dictionaries(
    {},
    optional={
        key: st.one_of(
            st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
            st.lists(st.integers(), max_size=2),
            st.dictionaries(st.text(max_size=2), st.integers()),
        )
        for key in ("rank", "pid", "step", "time", "step_time_s", "samples_per_s",
                    "data_wait_fraction", "peak_memory_mb", "device")
    },
)  # fmt: skip


def _show_everything(run_dir: Path) -> None:
    """The snapshot, rendered, and the --json and table commands: none may raise."""
    from rich.console import Console

    from paratrain.commands.monitor.command import render

    snap = snapshot(run_dir)
    Console(file=io.StringIO(), width=120).print(render(snap))
    json.dumps(snap)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["monitor", str(run_dir), "--json"]) == 0
    assert json.loads(printed.getvalue(), parse_constant=_not_json)["run_dir"] == str(run_dir)
    assert main(["monitor", str(run_dir), "--once"]) == 0


def _not_json(name: str) -> None:
    raise AssertionError(f"--json printed {name}, which is not JSON")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(content=st.binary(max_size=300))
def test_no_stats_file_makes_a_traceback_bytes(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    monkeypatch.setattr(
        "paratrain.commands.monitor.snapshot.HOST_SAMPLE_S", 0.0
    )  # CPU % is not tested
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "stats").mkdir()
    (run_dir / "stats" / "rank0.jsonl").write_bytes(content)
    _show_everything(run_dir)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(STATS_LINE, min_size=1, max_size=3))
def test_no_stats_record_makes_a_traceback(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    lines: list[dict[str, Any]],
) -> None:
    monkeypatch.setattr(
        "paratrain.commands.monitor.snapshot.HOST_SAMPLE_S", 0.0
    )  # CPU % is not tested
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "stats").mkdir()
    text = "\n".join(json.dumps(line, allow_nan=True) for line in lines)
    (run_dir / "stats" / "rank0.jsonl").write_text(text)
    (run_dir / "stats" / "rank1.jsonl").write_text(text.replace('"rank": 0', '"rank": 1'))
    _show_everything(run_dir)


def test_a_stats_file_that_is_a_folder_is_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _write(tmp_path / "run", [{"rank": 0}])
    (run_dir / "stats" / "rank1.jsonl").mkdir()
    assert main(["monitor", str(run_dir), "--once"]) == 0
    out = capsys.readouterr().out
    assert "rank1.jsonl cannot be read (it is a folder" in out and "Traceback" not in out
    assert main(["monitor", str(run_dir), "--json"]) == 0
    snap = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in snap["ranks"]] == [0] and "rank1.jsonl" in snap["notes"][0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are a POSIX feature")
def test_a_stats_file_that_is_a_named_pipe_is_a_note_not_a_hang(tmp_path: Path) -> None:
    run_dir = _write(tmp_path / "run", [{"rank": 0}])
    os.mkfifo(run_dir / "stats" / "rank1.jsonl")  # opening it to read would wait for a writer
    snap = snapshot(run_dir)
    assert [r["rank"] for r in snap["ranks"]] == [0]
    assert snap["notes"] == [f"{run_dir}/stats/rank1.jsonl cannot be read (it is a named pipe, "
                             "not a regular file)"]  # fmt: skip


@pytest.mark.skipif(sys.platform != "linux", reason="file names of any bytes: Linux file systems")
def test_a_file_name_that_is_not_utf8_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _write(tmp_path / "run", [{"rank": 0}])
    os.mkdir(os.fsencode(run_dir / "stats") + b"/rank\xff.jsonl")
    assert main(["monitor", str(run_dir), "--once"]) == 0
    assert "rank\ufffd.jsonl cannot be read" in capsys.readouterr().out


def test_a_run_dir_that_reads_as_markup_is_shown_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _write(tmp_path / "[/bold]", [{"rank": 0}])
    assert main(["monitor", str(run_dir), "--once"]) == 0
    assert "[/bold]" in capsys.readouterr().out


def test_only_the_end_of_a_long_stats_file_is_read(tmp_path: Path) -> None:
    from paratrain.commands.monitor.snapshot import TAIL_BYTES

    (tmp_path / "stats").mkdir()
    line = json.dumps({"rank": 0, "step": 1, "note": "x" * 200}) + "\n"
    lines = [line.replace('"step": 1', f'"step": {i}') for i in range(2 * TAIL_BYTES // len(line))]
    (tmp_path / "stats" / "rank0.jsonl").write_text("".join(lines))
    assert snapshot(tmp_path)["ranks"][0]["step"] == len(lines) - 1


def test_a_run_dir_that_is_a_file_is_one_paragraph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run").write_text("not a folder")
    with pytest.raises(SystemExit) as info:
        main(["monitor", str(tmp_path / "run"), "--once"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "is a file, not a folder" in " ".join(err.split())
    assert "Traceback" not in err and "paratrain monitor runs/paratrain" in " ".join(err.split())


def test_without_a_job_it_says_how_to_point_at_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from paratrain.commands.monitor import snapshot as module

    monkeypatch.setattr(module, "rank_processes", dict)  # no torchrun job on this machine
    assert main(["monitor", "--once"]) == 0
    out = capsys.readouterr().out
    assert "paratrain monitor RUN_DIR" in out and "host: CPU" in out
    assert "samples/s" not in out  # no empty ranks table


def test_without_a_run_dir_the_ranks_of_this_machine_come_with_the_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import psutil

    from paratrain.commands.monitor import snapshot as module

    monkeypatch.setattr(module, "rank_processes", lambda: {3: psutil.Process()})
    assert main(["monitor", "--once"]) == 0
    out = capsys.readouterr().out
    assert "samples/s" in out and "│ 3 " in out and "paratrain monitor RUN_DIR" in out


def test_piped_output_is_not_cut_at_80_columns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = _write(tmp_path / "run", [{"rank": 0}, {"rank": 1, "data_wait_fraction": 0.9}])
    assert main(["monitor", str(run_dir), "--once"]) == 0
    out = capsys.readouterr().out
    assert "raise num_workers, enable pin_memory, or cache/preprocess data" in out
    assert max(len(line) for line in out.splitlines()) > 80
