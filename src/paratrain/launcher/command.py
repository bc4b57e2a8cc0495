"""``paratrain run [options] script.py [args] | -m module [args]``: launch through torchrun.

    paratrain run --nproc 4 train.py --lr 3e-4
    paratrain run --nproc 2 --max-restarts 3 --run-dir runs/exp train.py   # restarts resume
    paratrain run --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500 train.py
    srun paratrain run train.py                     # inside Slurm: nodes and host from SLURM_*

The resolved topology is printed once. When a rank dies, the exit names the rank and its
signal; with ``--max-restarts K`` torchrun restarts the workers and ``Run`` resumes them from the
newest valid checkpoint in the run dir.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from paratrain.errors import ParatrainError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain run``."""
    p = subparsers.add_parser(
        "run",
        help="launch a training script on N ranks (torchrun)",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("--nproc", default="auto", help="ranks per node, or auto (= visible GPUs)")
    p.add_argument("--nnodes", type=int, default=None)
    p.add_argument("--node-rank", type=int, default=None)
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of node 0's rendezvous")
    p.add_argument("--rdzv-id", default=None)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--run-dir", type=Path, default=Path("runs/paratrain"))
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None)
    p.add_argument(
        "--torchrun-arg",
        action="append",
        default=[],
        dest="torchrun_args",
        help="extra torchrun option, repeatable (e.g. --torchrun-arg=--log-dir=logs)",
    )
    p.add_argument("target", nargs=argparse.REMAINDER, help="script.py [args] | -m module [args]")
    p.set_defaults(handler=run_command)


def failure_summary(output: str) -> str | None:
    """'rank 1 (local rank 1) was killed by SIGKILL' from torchrun's failure report."""
    root = output.rfind("Root Cause")
    if root < 0:
        return None
    block = output[root:]
    rank = re.search(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)", block)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", block)
    if rank is None or code is None:
        return None
    exit_code = int(code.group(1))
    if exit_code < 0:
        how = f"was killed by {signal.Signals(-exit_code).name}"
    else:
        how = f"exited with code {exit_code}"
    return f"rank {rank.group(1)} (local rank {rank.group(2)}) {how}"


def run_command(args: argparse.Namespace) -> int:
    """Validate, print the topology, run torchrun, explain a failure."""
    import torch

    from paratrain.launcher.plan import RunOptions, make_plan

    options = RunOptions(
        target=list(args.target),
        nproc=args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_id=args.rdzv_id,
        max_restarts=args.max_restarts,
        run_dir=args.run_dir,
        backend=args.backend,
        torchrun_args=args.torchrun_args,
    )
    plan = make_plan(options, env=os.environ, gpus=torch.cuda.device_count())
    print(f"paratrain run: {plan.describe()}; run dir {args.run_dir}", flush=True)
    shutil.rmtree(args.run_dir / "stacks", ignore_errors=True)  # a previous job's hang report
    for note in plan.notes:
        print(f"paratrain run: note: {note}", flush=True)
    proc = subprocess.Popen(
        plan.argv, env={**os.environ, **plan.env}, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    captured: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        captured.append(line)
    code = proc.wait()
    if code == 0:
        return 0
    summary = failure_summary("".join(captured[-200:]))
    from paratrain.watchdog import diagnose

    stalls = diagnose(args.run_dir / "stacks")
    if stalls is not None:
        summary = (
            f"stalled: {stalls['summary']} (the other ranks waited in collectives; "
            f"stacks of every rank in {args.run_dir / 'stacks'})"
        )
    raise ParatrainError(
        f"the job failed: {summary or f'torchrun exited with code {code}'}"
        + (f", after {args.max_restarts} restart(s)" if args.max_restarts else "")
        + ". The rank's own output is above; per-rank stacks and restarts are in "
        f"{args.run_dir}. Use --max-restarts K to restart and resume automatically."
    )
