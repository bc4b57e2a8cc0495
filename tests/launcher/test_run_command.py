"""``paratrain run`` end to end: the run dir the script reported, a crash before Run, Ctrl-C.

Each test starts a real ``paratrain run --nproc 2`` (torchrun, 2 gloo ranks) on a tiny script in
a temporary working directory. The fake scripts write the launcher report themselves, as
``paratrain.Run`` does; ``test_real_run_*`` depend on ``Run`` writing it (``PARATRAIN_REPORT``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

REPORTS_AND_FAILS = """
import json, os, sys
from pathlib import Path
from paratrain.distributed.environment import LaunchEnv

rank, run_dir = int(os.environ["RANK"]), Path(sys.argv[1]).resolve()
if rank == 0:
    LaunchEnv.read().write_report(
        {"run_dir": str(run_dir), "ckpt_dir": str(run_dir / "checkpoints"), "world_size": 2}
    )
(run_dir / "stacks").mkdir(parents=True, exist_ok=True)
(run_dir / f"env{rank}.txt").write_text(os.environ.get("PARATRAIN_RUN_DIR", "unset"))
record = {"rank": rank, "step": 7, "waiting_in_torch": rank == 0, "waiting": rank == 0,
          "call": None, "where": "x", "short": f"fake.py:{10 + rank}"}
(run_dir / "stacks" / f"rank{rank}.json").write_text(json.dumps(record))
sys.exit(3 if rank == 1 else 0)
"""

CRASHES_BEFORE_RUN = """
raise SystemExit("bad arguments, before paratrain.Run")
"""

SLEEPS = """
import os, sys, time
from pathlib import Path
Path(sys.argv[1], f"rank{os.environ['RANK']}.pid").write_text(str(os.getpid()))
time.sleep(120)
"""

REAL_RUN_FAILS = """
import sys
import paratrain as pt

run = pt.Run(strategy="ddp", run_dir=sys.argv[1], progress=False, stats_every=None)
if run.rank == 1:
    sys.exit(5)
run.barrier()
"""

REAL_RUN_SAVES_ON_ONE_RANK = """
import sys
import torch
import paratrain as pt

with pt.Run(strategy="ddp", run_dir=sys.argv[1], progress=False, timeout_s=6) as run:
    net = torch.nn.Linear(4, 2)
    model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    for _ in range(3):
        run.backward(model(torch.randn(8, 4)).sum())
        run.step(opt)
        if run.rank == 0:
            run.save()  # the bug: a collective on one rank only
"""


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(text)
    return path


def _command(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "paratrain", "run", "--nproc", "2", "--backend", "gloo",
            str(script), *args]  # fmt: skip


def _run(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = _script(tmp_path, text)
    return subprocess.run(
        _command(script, *args), cwd=tmp_path, capture_output=True, text=True, timeout=180
    )


def test_without_run_dir_the_message_uses_the_reported_one(tmp_path: Path) -> None:
    run_dir = tmp_path / "somewhere"
    proc = _run(tmp_path, REPORTS_AND_FAILS, str(run_dir))
    assert proc.returncode == 3, proc.stderr  # the failed rank's own code
    assert "run dir chosen by the script" in proc.stdout
    message = proc.stderr.split("paratrain: error:")[-1].replace("\n", " ")
    assert "stalled: rank 1 at step 7: fake.py:11" in message  # read from the reported stacks
    assert f"are in {run_dir.resolve()}" in message
    assert (run_dir / "env0.txt").read_text() == "unset"  # no --run-dir: not imposed on the script
    assert not (tmp_path / "runs").exists()


def test_a_script_that_fails_before_run_points_at_no_run_dir(tmp_path: Path) -> None:
    proc = _run(tmp_path, CRASHES_BEFORE_RUN)
    assert proc.returncode == 1
    message = proc.stderr.split("paratrain: error:")[-1].replace("\n", " ")
    assert "exited with code 1" in message and "reported no run dir" in message
    assert "runs/paratrain" not in message and not (tmp_path / "runs").exists()


def test_run_dir_given_reaches_the_script_and_its_stale_stacks_are_cleared(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "exp"
    (run_dir / "stacks").mkdir(parents=True)
    (run_dir / "stacks" / "rank5.json").write_text("{not json: a previous job's}")
    proc = _run(tmp_path, REPORTS_AND_FAILS.replace("sys.exit(3 if", "sys.exit(0 if"), str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert (run_dir / "env1.txt").read_text() == "unset"
    proc = subprocess.run(
        [*_command(_script(tmp_path, "print('ok')"))[:-1], "--run-dir", str(run_dir),
         str(tmp_path / "job.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"run dir {run_dir}" in proc.stdout and not (run_dir / "stacks").exists()


def _start_sleeping_job(tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    script = _script(tmp_path, SLEEPS)
    proc = subprocess.Popen(
        _command(script, str(tmp_path)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a job in a terminal
    )
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("rank*.pid"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(0.5)
    return proc, [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("whom", ["paratrain run only", "the whole terminal group"])
def test_ctrl_c_stops_the_job_and_says_interrupted(tmp_path: Path, whom: str) -> None:
    proc, ranks = _start_sleeping_job(tmp_path)
    started = time.monotonic()
    if whom == "paratrain run only":
        proc.send_signal(signal.SIGINT)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert time.monotonic() - started < 30
    assert "paratrain run: interrupted" in err
    assert "the job failed" not in err and "--max-restarts" not in err
    assert not any(_alive(pid) for pid in ranks)


def test_real_run_reports_its_run_dir(tmp_path: Path) -> None:
    """Needs ``paratrain.Run`` to write PARATRAIN_REPORT (run.py)."""
    proc = _run(tmp_path, REAL_RUN_FAILS, "chosen")
    assert proc.returncode == 5, proc.stderr
    message = proc.stderr.split("paratrain: error:")[-1].replace("\n", " ")
    assert "rank 1 (local rank 1) exited with code 5" in message
    assert f"are in {(tmp_path / 'chosen').resolve()}" in message


def test_real_run_save_on_one_rank_names_the_users_line(tmp_path: Path) -> None:
    """Needs ``paratrain.Run`` to write PARATRAIN_REPORT; no --run-dir: stacks from the report."""
    proc = _run(tmp_path, REAL_RUN_SAVES_ON_ONE_RANK, "chosen")
    assert proc.returncode == 1, proc.stderr  # the rank's own 2 (a usage error) is not passed on
    message = proc.stderr.replace("\n", " ")
    # The save's own check (0.8 x timeout_s) fires before the watchdog (0.9 x timeout_s).
    assert "run.save() is collective: every rank must call it" in message
    # Rank 0 raises from the failed save; on a loaded machine rank 1's watchdog (waiting in the
    # next all-reduce) can end first, so the launcher may name either rank.
    named = r"rank 0 raised CheckpointError: .* at \S*job.py:13|rank 1 \(local rank 1\) exited"
    assert re.search(named, message), message


REAL_RUN_RAISES = """
import sys
import torch
import paratrain as pt

run = pt.Run(strategy="ddp", run_dir=sys.argv[1], progress=False)
net = torch.nn.Linear(4, 2)
model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
for step in range(3):
    if run.rank == 1 and step == 1:
        raise ValueError("bad shape in my data")
    run.backward(model(torch.randn(8, 4)).sum())
    run.step(opt)
"""

REAL_RUN_KILLED = """
import os, signal, sys
import paratrain as pt

run = pt.Run(strategy="ddp", run_dir=sys.argv[1], progress=False)
if run.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
run.barrier()
"""


def test_a_rank_that_raises_is_shown_first_and_sets_the_exit_code(tmp_path: Path) -> None:
    proc = _run(tmp_path, REAL_RUN_RAISES, "chosen")
    assert proc.returncode == 1, proc.stderr  # Python's code for an uncaught exception, not 2
    tracebacks = re.findall(r"^\[rank(\d)\]: Traceback", proc.stderr, re.MULTILINE)
    assert tracebacks == ["1"], proc.stderr  # rank 0 only lost its peer: one line, no traceback
    assert re.search(r"^\[rank0\]: .*a peer failed", proc.stderr, re.MULTILINE), proc.stderr
    message = proc.stderr.split("paratrain: error:")[-1].replace("\n", " ")
    job = (tmp_path / "job.py").resolve()
    assert f"rank 1 raised ValueError: bad shape in my data at {job}:11" in message, message
    assert "--max-restarts" not in message and "a restart would raise it again" in message


def test_a_rank_killed_by_a_signal_suggests_a_restart(tmp_path: Path) -> None:
    proc = _run(tmp_path, REAL_RUN_KILLED, "chosen")
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    message = proc.stderr.split("paratrain: error:")[-1].replace("\n", " ")
    assert "rank 1 (local rank 1) was killed by SIGKILL" in message
    assert "--max-restarts K resumes from the newest checkpoint" in message


ECHOES_ITS_ARGUMENTS = """
import json, os, sys
from pathlib import Path
Path(os.environ["ARGS_OUT"], f"rank{os.environ['RANK']}.json").write_text(json.dumps(sys.argv[1:]))
"""

SCRIPT_FLAGS = ["--n", "5", "--nproc", "3", "-m", "x", "-h", "--run-dir=y", "--", "--z"]


def test_everything_after_the_script_belongs_to_the_script(tmp_path: Path) -> None:
    script = _script(tmp_path, ECHOES_ITS_ARGUMENTS)
    # --n is a prefix of --nproc, --nnodes and --node-rank: argparse once took it as ambiguous.
    command = [sys.executable, "-m", "paratrain", "run", "--nproc", "1", "--backend", "gloo"]
    env = {**os.environ, "ARGS_OUT": str(tmp_path)}
    done = subprocess.run(
        [*command, str(script), *SCRIPT_FLAGS],
        cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "rank0.json").read_text()) == SCRIPT_FLAGS


def test_everything_after_the_module_belongs_to_the_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from paratrain.commands import cli
    from paratrain.commands.run import command
    from paratrain.commands.run.arguments import VALUED_OPTIONS

    seen = []
    monkeypatch.setattr(command, "run_command", lambda args: seen.append(args) or 0)
    assert cli.main(["run", "--nproc", "2", "-m", "pkg.train", *SCRIPT_FLAGS]) == 0
    assert seen[-1].target == ["-m", "pkg.train", *SCRIPT_FLAGS] and seen[-1].nproc == "2"
    assert cli.main(["run", "--run-dir=r", "--", "t.py", "--n", "5"]) == 0
    assert seen[-1].target == ["t.py", "--n", "5"] and str(seen[-1].run_dir) == "r"
    from paratrain.commands.verify import command as verify

    subparsers = argparse.ArgumentParser().add_subparsers()
    command.add_parser(subparsers)
    verify.add_parser(subparsers)
    for name, parser in subparsers.choices.items():
        valued = {
            s
            for a in parser._actions
            if a.option_strings and a.nargs not in (0, argparse.REMAINDER)
            for s in a.option_strings
        }
        assert valued == VALUED_OPTIONS[name]  # the splitter knows every option with a value

    checked = []
    monkeypatch.setattr(verify, "verify_command", lambda args: checked.append(args) or 0)
    assert cli.main(["verify-resume", "--kills", "2", "t.py", "--n", "5", "--json"]) == 0
    assert checked[-1].target == ["t.py", "--n", "5", "--json"] and checked[-1].kills == 2
    assert checked[-1].json is False  # the script's --json, not verify-resume's


NEVER_CLOSED = """
import atexit, os, sys
import torch
import torch.distributed as dist
import paratrain as pt

out = sys.argv[1]
# Registered before the Run: atexit runs it after the Run's own handler (last in, first out).
atexit.register(lambda: open(f"{out}/rank{os.environ['RANK']}", "w").write(
    "destroyed" if not dist.is_initialized() else "alive"))
run = pt.Run(strategy="ddp", accelerator="cpu", progress=False)
net = torch.nn.Linear(3, 1)
model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
run.backward(model(torch.ones(2, 3)).sum())
run.step(opt)
# No run.close() and no `with`: as most scripts end.
"""


def test_a_run_never_closed_destroys_its_process_group_at_exit(tmp_path: Path) -> None:
    """Left to interpreter finalization, gloo's threads can abort a rank that finished
    (SIGABRT, "terminate called without an active exception"); a Run the script never closed
    is closed at exit, while Python is whole, and its process group destroyed."""
    proc = _run(tmp_path, NEVER_CLOSED, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["destroyed"] * 2
    assert "terminate called" not in proc.stderr
