"""``paratrain run`` passes Ctrl-C on to torchrun exactly once, whoever received it."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from paratrain.commands.run.supervise import supervise

# Stands in for torchrun: logs like it on SIGINT, then exits with the number of SIGINTs it got
# within 2.5 s of the first (a forwarded duplicate arrives about 1 s after the first).
FAKE_TORCHRUN = """
import os, signal, sys, time
from pathlib import Path

got = []

def on_int(signum, frame):
    got.append(time.monotonic())
    print("W torchrun] Received Signals.SIGINT death signal, shutting down workers",
          file=sys.stderr, flush=True)

signal.signal(signal.SIGINT, on_int)
Path(sys.argv[1]).write_text(str(os.getpid()))
deadline = time.monotonic() + 20
while time.monotonic() < deadline and not (got and time.monotonic() > got[0] + 2.5):
    time.sleep(0.05)
sys.exit(len(got))
"""


@pytest.mark.parametrize("terminal", [False, True])
def test_the_interrupt_reaches_torchrun_once(tmp_path: Path, terminal: bool) -> None:
    ready = tmp_path / "child.pid"
    script = tmp_path / "fake_torchrun.py"
    script.write_text(FAKE_TORCHRUN)

    def press_ctrl_c() -> None:
        while not ready.exists() or not ready.read_text():
            time.sleep(0.05)
        if terminal:  # a terminal signals its whole foreground group: the child as well
            os.kill(int(ready.read_text()), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    code, stopped_by, tail = supervise([sys.executable, str(script), str(ready)], {**os.environ})
    assert stopped_by == signal.SIGINT
    assert code == 1, tail  # exactly one SIGINT reached the child
    assert tail.count("death signal") == 1


def _shown(text: str) -> str:
    from paratrain.commands.run.supervise import AgentNoise

    noise = AgentNoise()
    out = [shown for line in text.splitlines(keepends=True) for shown in noise.feed(line)]
    return "".join(out + noise.flush())


def test_torchruns_own_child_failed_traceback_is_dropped_and_the_ranks_output_kept() -> None:
    text = (
        "[rank0]: Traceback (most recent call last):\n[rank0]: ValueError: the script's error\n"
        "E1123 api.py:1002] failed (exitcode: 1) local_rank: 0\n"
        'Traceback (most recent call last):\n  File "run.py", line 1, in <module>\n'
        "    main()\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "=====\njob.py FAILED\n-----\nFailures:\n  <NO_OTHER_FAILURES>\n-----\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n=====\n"
        "after\n"
    )
    shown = _shown(text)
    assert "the script's error" in shown and "failed (exitcode: 1)" in shown
    assert (
        "ChildFailedError" not in shown
        and "Root Cause" not in shown
        and 'File "run.py"' not in shown
    )
    assert shown.endswith("after\n")


def test_any_other_torchrun_traceback_is_shown_whole() -> None:
    text = 'Traceback (most recent call last):\n  File "x.py", line 2\nRendezvousError: timeout\n'
    assert _shown(text) == text


def test_a_signal_as_the_ranks_finish_leaves_the_jobs_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGTERM reached `paratrain run` in the last second, but torchrun ended with every rank's
    success: the job succeeded (exit 0, not 143)."""
    from paratrain.commands import cli
    from paratrain.commands.run import command

    monkeypatch.setattr(command, "supervise", lambda *a, **k: (0, signal.SIGTERM, ""))
    script = tmp_path / "train.py"
    script.write_text("print('done')\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--nproc", "1", str(script)]) == 0
    assert "got SIGTERM as the ranks were finishing" in capsys.readouterr().err
    monkeypatch.setattr(command, "supervise", lambda *a, **k: (1, signal.SIGTERM, ""))
    assert cli.main(["run", "--nproc", "1", str(script)]) == 143
