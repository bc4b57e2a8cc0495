"""The Slurm script and the Kubernetes manifests run the shipped example, as written.

Each test takes the exact command of ``examples/slurm.sbatch`` or a manifest's container and runs
it on this machine as one node of 2 CPU ranks: the sbatch script under a stand-in ``srun`` that
sets what Slurm sets for a one-node job, a manifest's command with the variables its
Kubernetes (or the PyTorchJob operator) would give the pod, sizes turned down through the
variables the files expose.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from paratrain.distributed.ports import free_port
from tests.examples.support import EXAMPLES, ROOT

pytestmark = pytest.mark.examples

FAKE_SRUN = """#!/usr/bin/env bash
# One node, one task: what srun sets for `#SBATCH --nodes=1 --ntasks-per-node=1`.
export SLURM_NNODES=1 SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1
export SLURM_JOB_NODELIST=localhost SLURM_NODELIST=localhost
exec "$@"
"""


def _workdir(tmp_path: Path) -> Path:
    """A folder laid out like the repository root the files expect (``examples/`` in it)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "examples").symlink_to(EXAMPLES)
    return work


def _env(extra: dict[str, str]) -> dict[str, str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", **extra}


def _check_trained(proc: subprocess.CompletedProcess[str], run_dir: Path) -> None:
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.count("epoch 0: loss") == 1  # two ranks, the main process prints once
    assert "world size 2" in proc.stdout
    assert len(list((run_dir / "checkpoints").iterdir())) == 1
    weights = torch.load(run_dir / "model.pt", weights_only=True)
    assert weights["0.weight"].shape == (128, 16)


def test_the_sbatch_script_trains_the_example(tmp_path: Path) -> None:
    sbatch = (EXAMPLES / "slurm.sbatch").read_text()
    scripts = re.findall(r"paratrain run .*?\s(examples/\S+\.py)", sbatch.replace("\\\n", " "))
    assert scripts and all((ROOT / s).is_file() for s in scripts)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    work = _workdir(tmp_path)
    env = _env({"SLURM_JOB_ID": "4242", "NPROC": "2", "EPOCHS": "1"})
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "slurm.sbatch")], cwd=work, env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert "slurm" in proc.stdout  # paratrain run took the topology from Slurm's variables
    _check_trained(proc, work / "runs" / "4242")


def _containers(manifest: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all((EXAMPLES / "k8s" / manifest).read_text()):
        if doc["kind"] == "PyTorchJob":
            found += [
                c
                for spec in doc["spec"]["pytorchReplicaSpecs"].values()
                for c in spec["template"]["spec"]["containers"]
            ]
        elif doc["kind"] == "Job":
            found += doc["spec"]["template"]["spec"]["containers"]
    return found


@pytest.mark.parametrize(
    ("manifest", "pod"),
    [
        # The PyTorchJob operator's torchrun variables for node 0 of a one-node job.
        ("pytorchjob.yaml", {"PET_NPROC_PER_NODE": "2", "PET_NNODES": "1", "PET_NODE_RANK": "0",
                             "PET_MASTER_ADDR": "127.0.0.1"}),
        # An Indexed Job's pod 0, its manifest variables set for one node of 2 ranks.
        ("job.yaml", {"JOB_COMPLETION_INDEX": "0", "NNODES": "1", "NPROC": "2",
                      "MASTER_HOST": "127.0.0.1"}),
    ],
)  # fmt: skip
def test_a_manifest_command_trains_the_example(
    manifest: str, pod: dict[str, str], tmp_path: Path
) -> None:
    containers = _containers(manifest)
    assert containers and len({c["args"][0] for c in containers}) == 1  # every pod: one command
    container = containers[0]
    assert container["command"] == ["bash", "-c"] and container["workingDir"] == "/opt/paratrain"
    command = container["args"][0]
    scripts = [w for w in shlex.split(command) if w.endswith(".py")]
    assert scripts and all((ROOT / s).is_file() for s in scripts)
    manifest_env = {e["name"]: e["value"] for e in container["env"]}
    port = str(free_port())
    run_dir = tmp_path / "run"
    env = _env({**manifest_env, **pod, "PET_MASTER_PORT": port, "RDZV_PORT": port,
                "RUN_DIR": str(run_dir), "EPOCHS": "1", "OMP_NUM_THREADS": "1"})  # fmt: skip
    proc = subprocess.run(
        ["bash", "-c", command], cwd=_workdir(tmp_path), env=env, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    _check_trained(proc, run_dir)
