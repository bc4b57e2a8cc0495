"""``paratrain run [options] script.py [args] | -m module [args]``: launch through torchrun.

    paratrain run --nproc 4 train.py --lr 3e-4
    paratrain run --nproc 2 --max-restarts 3 --run-dir runs/exp train.py   # restarts resume
    paratrain run --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500 train.py
    srun paratrain run train.py                     # inside Slurm: nodes and host from SLURM_*

The resolved topology is printed once. When a rank dies, the exit names the rank and its
signal; when a rank stalls, the stalled rank and its line (from the run dir's ``stacks/``). The
run dir is the one the script's ``Run`` reported (``PARATRAIN_REPORT``), which is ``--run-dir``
when given. With ``--max-restarts K`` torchrun restarts the workers and ``Run`` resumes them from
the newest valid checkpoint in the run dir. Ctrl-C (SIGINT) or SIGTERM is passed on to torchrun,
which stops the ranks; ``paratrain run`` then says "interrupted" and exits with 130 (143).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from paratrain.cli_types import non_negative_int, positive_int
from paratrain.distributed.environment import read_report
from paratrain.distributed.watchdog import diagnose
from paratrain.errors import ParatrainError
from paratrain.launcher.ranks import SECONDARY_ERRORS
from paratrain.launcher.supervise import STOPPED, supervise
from paratrain.run_dir import RunDir


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain run``."""
    p = subparsers.add_parser(
        "run",
        help="launch a training script on N ranks (torchrun)",
        allow_abbrev=False,
        description=__doc__.split("\n")[0],
    )
    p.add_argument("--nproc", default="auto", help="ranks per node, or auto (= visible GPUs)")
    p.add_argument("--nnodes", type=positive_int, default=None)
    p.add_argument("--node-rank", type=non_negative_int, default=None)
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of node 0's rendezvous")
    p.add_argument("--rdzv-id", default=None)
    p.add_argument("--max-restarts", type=non_negative_int, default=0)
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="the run dir of every rank (default: the script's run_dir=, else runs/paratrain)",
    )
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None)
    p.add_argument(
        "--torchrun-arg",
        action="append",
        default=[],
        dest="torchrun_args",
        help="extra torchrun option, repeatable (e.g. --torchrun-arg=--log-dir=logs)",
    )
    p.add_argument(
        "target",
        nargs=argparse.REMAINDER,
        help="script.py [args] | -m module [args]: everything after the script path (or the "
        "module) goes to the script as it is",
    )
    p.set_defaults(handler=run_command)


def failure_summary(output: str) -> str | None:
    """'rank 1 (local rank 1) was killed by SIGKILL' from torchrun's failure report.

    torchrun names the first failure it observed; when that rank only lost its peer (its output
    says so), the rank that failed on its own is named instead."""
    start = output.rfind("Failures:")
    root = output.rfind("Root Cause")
    if root < 0:
        return None
    entries = [
        (int(m.group(1)), int(m.group(2)), int(m.group(3)))
        for block in (output[root:], output[start:root] if 0 <= start < root else "")
        for m in re.finditer(
            r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)", block
        )
    ]
    if not entries:
        return None
    lost_peer = {r for r, _, _ in entries if _only_lost_its_peer(output, r)}
    rank, local, exit_code = next((e for e in entries if e[0] not in lost_peer), entries[0])
    if exit_code < 0:
        how = f"was killed by {signal.Signals(-exit_code).name}"
    else:
        how = f"exited with code {exit_code}"
    return f"rank {rank} (local rank {local}) {how}"


def _only_lost_its_peer(output: str, rank: int) -> bool:
    lines = [line for line in output.splitlines() if line.startswith(f"[rank{rank}]:")]
    return any(marker in line for line in lines for marker in SECONDARY_ERRORS)


def run_command(args: argparse.Namespace) -> int:
    """Validate, print the topology, run torchrun, explain a failure or an interrupt."""
    import torch

    from paratrain.launcher.plan import RunOptions, make_plan

    with tempfile.TemporaryDirectory(prefix="paratrain-run-") as tmp:
        report = Path(tmp) / "report.json"
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
            report=report,
        )
        plan = make_plan(options, env=os.environ, gpus=torch.cuda.device_count())
        where = f"run dir {args.run_dir}" if args.run_dir else "run dir chosen by the script"
        print(f"paratrain run: {plan.describe()}; {where}", flush=True)
        if args.run_dir is not None:  # a previous job's hang report would be taken for this one's
            shutil.rmtree(RunDir(args.run_dir).stacks, ignore_errors=True)
        for note in plan.notes:
            print(f"paratrain run: note: {note}", flush=True)
        code, stopped_by, output = supervise(plan.argv, {**os.environ, **plan.env})
        if stopped_by is not None:
            print(f"paratrain run: {STOPPED[stopped_by][0]}", file=sys.stderr, flush=True)
            return STOPPED[stopped_by][1]
        if code == 0:
            return 0
        run_dir = reported_run_dir(report, known=args.run_dir)
    raise ParatrainError(
        failure_message(code, output, run_dir, args.max_restarts, node_rank=plan.node_rank)
    )


def reported_run_dir(report: Path, *, known: Path | None) -> Path | None:
    """The run dir the script's Run reported, else ``--run-dir``, else None (unknown)."""
    record = read_report(report)
    reported = record.get("run_dir") if record else None
    return Path(reported) if isinstance(reported, str) else known


def failure_message(
    code: int, output: str, run_dir: Path | None, max_restarts: int, *, node_rank: int = 0
) -> str:
    """Why the job failed: the rank and its signal, or the stalled rank, and where to look."""
    summary = failure_summary(output) or f"torchrun exited with code {code}"
    stacks = RunDir(run_dir).stacks if run_dir is not None else None
    stalls = diagnose(stacks) if stacks is not None else None
    if stalls is not None:
        summary = f"stalled: {stalls['summary']}; stacks of every rank in {stacks}"
    text = f"the job failed: {summary}"
    if max_restarts:
        text += f", after {max_restarts} restart(s)"
    text += ". The rank's own output is above"
    if run_dir is not None:
        text += f"; per-rank stacks, stats and restarts are in {run_dir}"
    elif node_rank == 0:
        text += (
            "; the script reported no run dir (it ended before creating paratrain.Run), so "
            "there are no stacks to show"
        )
    else:  # the main process (rank 0), which reports the run dir, runs on node 0
        text += "; node 0's paratrain run names the run dir (or pass --run-dir on every node)"
    return text + ". Use --max-restarts K to restart and resume automatically."
