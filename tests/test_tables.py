"""Every command's tables are readable in a pipe and a log: as wide as ``COLUMNS`` or 160
columns when there is no terminal, so that no row is folded over several lines (rich alone would
squeeze them into 80)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from paratrain.commands import tables
from paratrain.commands.monitor.command import console as monitor_console
from paratrain.commands.verify.compare import Difference
from paratrain.commands.verify.kill_points import Choice
from paratrain.commands.verify.render import show
from paratrain.commands.verify.report import Options, Outcome, Report
from paratrain.core.faults import KillPoint


def test_the_width_is_the_terminals_else_columns_else_160(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert tables.width() == tables.LOG_WIDTH == 160
    monkeypatch.setenv("COLUMNS", "120")
    assert tables.width() == 120
    monkeypatch.setenv("COLUMNS", "40")  # a narrow COLUMNS still gets 80
    assert tables.width() == 80
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert tables.width() is None  # rich measures the terminal
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    monkeypatch.delenv("COLUMNS")
    assert monitor_console().width == 160


def test_doctor_in_a_pipe_keeps_every_row_on_one_line(tmp_path: Path) -> None:
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)}  # no COLUMNS
    done = subprocess.run(
        [sys.executable, "-m", "paratrain", "doctor", "--quick"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= 160
    rows = [line for line in lines if line.startswith("│")]
    assert rows, done.stdout
    # A folded row continues on a line whose first cell is empty.
    folded = [line for line in rows if re.match(r"│\s+│", line)]
    assert folded == [], "\n".join(lines)


def test_verify_resume_in_a_pipe_keeps_a_long_first_difference_on_its_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    difference = Difference(
        "rank 1/optimizers/optimizer/state/model.layers.0.attention.wq.weight/exp_avg_sq",
        "max |Δ| 3.1e-03",
        3.1e-3,
    )
    outcome = Outcome(
        choice=Choice(KillPoint("mid_window", 6, 1), 5, 0), step=5, epoch=0, run_dir=tmp_path,
        result="DIFFERS", resumed_from=4, difference=difference, seconds=12.5,
    )  # fmt: skip
    report = Report(options=Options(target=["train.py"], nproc=2), straight_s=[10.0])
    report.kills.append(outcome)
    show(report)  # the console of a command: stdout here is captured, not a terminal
    out = capsys.readouterr().out
    assert str(difference) in out.replace("\n", " ")
    assert any(str(difference) in line for line in out.splitlines()), out
