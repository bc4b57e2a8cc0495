"""An elastic job loses a node and goes on: two ``paratrain run --nnodes 1:2`` agents on this
machine act as two nodes (c10d rendezvous on loopback, one rank each; the first hosts the
rendezvous store, and the second starts once it listens). Once the job has taken 6
steps, the second agent and its rank are SIGKILLed. The first agent's rank fails on the lost
peer, torchrun re-forms the job with one node, and the run resumes from its newest checkpoint at
world size 1 with grad_accum 2, keeping the global batch of 16.

It must end within 1e-5 of one uninterrupted process at the same global batch, see every sample
once per epoch (the samples of the steps rolled back by the resume are trained again, once),
and record the change in restarts.jsonl.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from paratrain.distributed.ports import free_port

pytestmark = pytest.mark.scale

JOB = Path(__file__).with_name("job.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _agent(run_dir: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "paratrain", "run", "--nnodes", "1:2", "--nproc", "1",
        "--max-restarts", "3", "--rdzv-endpoint", f"127.0.0.1:{port}", "--backend", "gloo",
        "--torchrun-arg=--rdzv-conf=last_call_timeout=3", str(JOB), str(run_dir),
        "--sleep", "0.3",
    ]  # fmt: skip
    return subprocess.Popen(command, env=ENV, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``proc``'s agent listens on ``port`` (its rendezvous store): started before that,
    the second agent may host the store itself (on a busy machine an agent takes seconds to
    start), and killing that node would then take the store away from the survivor."""
    deadline = time.monotonic() + 120
    while not any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        for c in psutil.net_connections(kind="tcp")
    ):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the first agent never listened on its port"
        time.sleep(0.05)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue


def _samples(run_dir: Path, resumed_step: int) -> dict[int, list[int]]:
    """Sample ids trained per epoch, without the first attempt's steps the resume rolled back."""
    seen: dict[int, list[int]] = {}
    for path in sorted((run_dir / "samples").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r["attempt"] == 0 and r["step"] >= resumed_step:
                continue
            seen.setdefault(r["epoch"], []).extend(r["ids"])
    return seen


def test_losing_a_node_goes_on_at_the_same_global_batch(tmp_path: Path) -> None:
    reference = tmp_path / "reference"
    done = subprocess.run(
        [sys.executable, str(JOB), str(reference), "--grad-accum", "2"],
        env=ENV,
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir, port = tmp_path / "elastic", free_port()
    first = _agent(run_dir, port, tmp_path / "first.log")
    _wait_listening(port, first, tmp_path / "first.log")  # the first node hosts the store
    second = _agent(run_dir, port, tmp_path / "second.log")
    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "at-step-6").exists():
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the 2-node job never reached step 6"
            time.sleep(0.1)
        _kill_tree(second)  # the node is gone: its agent and its rank
        assert first.wait(timeout=240) == 0, (tmp_path / "first.log").read_text()[-4000:]
    finally:
        _kill_tree(first)
        _kill_tree(second)
    log = (tmp_path / "first.log").read_text()
    assert "grad_accum set to 2 to keep the global batch 16 at world size 1" in log
    restarts = [json.loads(x) for x in (run_dir / "restarts.jsonl").read_text().splitlines()]
    assert [(r["world_size"], r["saved_world_size"], r["grad_accum"]) for r in restarts] == [
        (1, 2, 2)
    ]
    a = torch.load(reference / "final.pt", weights_only=True)
    b = torch.load(run_dir / "final.pt", weights_only=True)
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-5
    seen = _samples(run_dir, restarts[0]["step"])
    assert sorted(seen) == [0, 1, 2]
    for epoch, ids in seen.items():
        assert sorted(ids) == list(range(128)), f"epoch {epoch}: a sample missed or seen twice"
