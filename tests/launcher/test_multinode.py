"""Two "nodes" on loopback rendezvous through torchrun's c10d and train like one 2-rank node."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmarks.chaos import SCRIPT, final_weights, launch

pytestmark = pytest.mark.dist


def test_two_nodes_match_one_node(tmp_path: Path) -> None:
    single = launch(tmp_path / "single")
    assert single.returncode == 0, single.stderr[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = tmp_path / "two-nodes"  # shared by both nodes, as on a cluster file system
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "paratrain",
                "run",
                "--nproc",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "loopback",
                "--backend",
                "gloo",
                "--run-dir",
                str(run_dir),
                str(SCRIPT),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=240) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-3000:]
    assert "2 node(s) x 1 rank(s) = 2 rank(s)" in outputs[0][0]
    expected, got = final_weights(tmp_path / "single"), final_weights(run_dir)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
