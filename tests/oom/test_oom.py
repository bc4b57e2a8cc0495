"""An out-of-memory error explains itself: the rank, the phase of the step, what held the memory,
and the changes that would fit, each with its peak; a rank the kernel's OOM killer took is named so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from paratrain.commands.run import failure
from paratrain.runtime import oom

JOB = Path(__file__).with_name("oom_job.py")
SIGKILLED = """Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_20:31:05
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 16805)
"""


def _raised(call: object) -> BaseException:
    try:
        call()  # type: ignore[operator]
    except BaseException as error:
        return error
    raise AssertionError("nothing raised")


def _boom(*_: object) -> None:
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")


def test_the_phase_is_read_from_where_the_error_came_from() -> None:
    model = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    handle = model.register_forward_hook(_boom)
    assert oom.phase_of(_raised(lambda: model(x))) == "forward"
    handle.remove()
    out = model(x)
    out.register_hook(_boom)
    assert oom.phase_of(_raised(lambda: out.sum().backward())) == "backward"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.register_step_pre_hook(_boom)
    assert oom.phase_of(_raised(optimizer.step)) == "optimizer"


def test_what_counts_as_out_of_memory_and_how_much_was_asked() -> None:
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has")
    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 17179869184 bytes. Error code 12"
    )
    assert oom.is_out_of_memory(cuda) and oom.is_out_of_memory(cpu)
    assert oom.is_out_of_memory(MemoryError())
    assert not oom.is_out_of_memory(RuntimeError("shape mismatch"))
    assert oom.asked(cuda) == int(1.5 * 2**30)
    assert oom.asked(cpu) == 2**34
    assert oom.asked(MemoryError()) is None


def test_each_change_names_the_peak_it_would_need() -> None:
    held = oom.Held(parameters=2 * 2**30, gradients=2 * 2**30, optimizer=4 * 2**30,
                    total=40 * 2**30, device="NVIDIA H100 (cuda:0)")  # fmt: skip
    assert held.state == 8 * 2**30 and held.activations == 32 * 2**30
    changes = oom.fixes(held, wanted=2**30, strategy="ddp", world=8, grad_accum=2, blocks=12)
    assert changes[0].startswith("halve the per-rank batch and set grad_accum=4")
    assert changes[0].endswith("about 24.50 GiB")  # 8 + (32 + 1) / 2
    assert "12 repeated blocks" in changes[1] and changes[1].endswith("about 13.50 GiB")
    assert changes[2].startswith("strategy='fsdp'") and changes[2].endswith("about 34.00 GiB")
    sharded = oom.fixes(held, wanted=0, strategy="fsdp", world=8, grad_accum=1, blocks=0)
    assert any(c.startswith("fsdp_offload=True") for c in sharded)


@pytest.mark.parametrize(
    ("phase", "named"),
    [("forward", "forward (or loss)"), ("backward", "backward"), ("optimizer", "optimizer step")],
)
def test_a_rank_that_runs_out_explains_itself(phase: str, named: str, tmp_path: Path) -> None:
    env = {**os.environ, "PARATRAIN_RUN_DIR": str(tmp_path / "run"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(JOB), phase], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1
    paragraph = next(line for line in done.stderr.splitlines() if "ran out of memory" in line)
    assert paragraph.startswith(
        f"paratrain: rank 0 ran out of memory (OutOfMemoryError) in the {named} of step 3"
    )
    assert "asked for 2.00 GiB more" in paragraph
    assert "halve the per-rank batch and set grad_accum=2" in paragraph
    assert "4 repeated blocks" in paragraph
    saved = (tmp_path / "run" / "oom" / "rank0.txt").read_text()
    assert saved.strip() == paragraph.removeprefix("paratrain: ")


def test_oom_killer_counts_are_read_from_either_cgroup_version(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "job").mkdir(parents=True)
    (v2 / "job" / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    member = tmp_path / "cgroup-v2"
    member.write_text("0::/job\n")
    assert failure.oom_kills(v2, member) == 2
    v1 = tmp_path / "v1"
    (v1 / "memory" / "job").mkdir(parents=True)
    (v1 / "memory" / "job" / "memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
    )
    member.write_text("4:memory:/job\n0::/\n")
    assert failure.oom_kills(v1, member) == 5
    assert failure.oom_kills(tmp_path / "none", member) is None


def test_a_sigkill_by_the_oom_killer_is_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failure, "oom_kills", lambda: 1)
    text = failure.failure_message(137, SIGKILLED, None, 0, oom_kills_before=0)
    assert "rank 1 (local rank 1) was killed by SIGKILL: the kernel's out-of-memory killer" in text
    assert "from 0 to 1" in text and "paratrain plan" in text
    monkeypatch.setattr(failure, "oom_kills", lambda: 0)  # no kill counted: another SIGKILL
    text = failure.failure_message(137, SIGKILLED, None, 0, oom_kills_before=0)
    assert "out-of-memory killer" not in text and "killed from outside" in text


@pytest.mark.dist
def test_paratrain_run_names_the_rank_that_hit_a_real_memory_limit(tmp_path: Path) -> None:
    """Rank 1 gets a real address-space limit and allocates past it: torch's CPU allocator
    fails, and `paratrain run`'s failure summary is that rank's paragraph."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "paratrain", "run", "--nproc", "2", "--run-dir",
         str(tmp_path / "run"), str(JOB), "real", "--rank", "1", "--limit-mib", "300"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    summary = " ".join(done.stderr.split("the job failed:")[-1].split())
    assert summary.startswith(
        "rank 1 ran out of memory (RuntimeError) in the forward (or loss) of step 3"
    ), summary
    assert "asked for 16.00 GiB more" in summary
    assert "A restart would run out of memory again" in summary
