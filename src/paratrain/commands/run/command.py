"""``paratrain run [options] script.py [args] | -m module [args]``: launch through torchrun.

    paratrain run --nproc 4 train.py --lr 3e-4
    paratrain run --nproc 2 --max-restarts 3 --run-dir runs/exp train.py   # restarts resume
    paratrain run --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500 train.py
    paratrain run --nnodes 1:4 --max-restarts 10 --rdzv-endpoint node0:29500 train.py  # elastic
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
import shutil
import sys
import tempfile
from pathlib import Path

from paratrain.commands.cli_types import non_negative_int, positive_int
from paratrain.commands.run.failure import (
    PREEMPTED_EXIT,
    exit_status,
    failure_message,
    oom_kills,
    preemption_note,
    reported_run_dir,
    root_failure,
)
from paratrain.commands.run.rank_output import RankTracebacks
from paratrain.commands.run.supervise import STOPPED, supervise
from paratrain.core.run_dir import RunDir
from paratrain.distributed.gpus import visible_gpus
from paratrain.errors import JobFailedError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain run``."""
    p = subparsers.add_parser(
        "run",
        help="launch a training script on N ranks (torchrun)",
        allow_abbrev=False,
        description=__doc__.split("\n")[0],
    )
    p.add_argument("--nproc", default="auto", help="ranks per node, or auto (= visible GPUs)")
    p.add_argument(
        "--nnodes",
        type=node_count,
        default=None,
        help="machines in the job: N, or MIN:MAX for an elastic job that goes on when nodes "
        "leave or join (default 1, or Slurm's)",
    )
    p.add_argument(
        "--node-rank",
        type=non_negative_int,
        default=None,
        help="this machine's index, 0 to nnodes-1 (default 0, or Slurm's)",
    )
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of node 0's rendezvous")
    p.add_argument(
        "--rdzv-id",
        default=None,
        help="job id shared by every node (default: SLURM_JOB_ID when set)",
    )
    p.add_argument(
        "--max-restarts",
        type=non_negative_int,
        default=0,
        help="restart the ranks up to K times after a failure; each restart resumes from the "
        "newest checkpoint (default 0)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="the run dir of every rank (default: the script's run_dir=, else runs/paratrain)",
    )
    p.add_argument(
        "--backend",
        choices=("nccl", "gloo"),
        default=None,
        help="process-group backend (default: nccl with GPUs, else gloo)",
    )
    previous = p.add_mutually_exclusive_group()
    previous.add_argument(
        "--resume",
        action="store_const",
        const="resume",
        dest="previous_run",
        help="continue from the newest checkpoint in the run dir, even one of another run "
        "(sets previous_run='resume' on every rank)",
    )
    previous.add_argument(
        "--fresh",
        action="store_const",
        const="fresh",
        dest="previous_run",
        help="start at step 0; another run's checkpoints are moved aside, not mixed with "
        "this run's (sets previous_run='fresh' on every rank)",
    )
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


def node_count(text: str) -> tuple[int, int]:
    """``--nnodes``: ``N`` as (N, N), or ``MIN:MAX`` (an elastic job) as (MIN, MAX)."""
    low, colon, high = text.partition(":")
    try:
        pair = (positive_int(low), positive_int(high if colon else low))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected N or MIN:MAX (positive whole numbers), got {text!r}"
        ) from None
    if pair[0] > pair[1]:
        raise argparse.ArgumentTypeError(f"MIN must not exceed MAX in {text!r}")
    return pair


def run_command(args: argparse.Namespace) -> int:
    """Validate, print the topology, run torchrun, explain a failure or an interrupt."""
    from paratrain.commands.run.plan import RunOptions, make_plan

    with tempfile.TemporaryDirectory(prefix="paratrain-run-") as tmp:
        report = Path(tmp) / "report.json"
        options = RunOptions(
            target=list(args.target),
            nproc=args.nproc,
            nnodes=args.nnodes[1] if args.nnodes else None,
            min_nnodes=args.nnodes[0] if args.nnodes and args.nnodes[0] != args.nnodes[1] else None,
            node_rank=args.node_rank,
            rdzv_endpoint=args.rdzv_endpoint,
            rdzv_id=args.rdzv_id,
            max_restarts=args.max_restarts,
            run_dir=args.run_dir,
            backend=args.backend,
            previous_run=args.previous_run,
            torchrun_args=args.torchrun_args,
            report=report,
        )
        plan = make_plan(options, env=os.environ, gpus=visible_gpus())
        where = f"run dir {args.run_dir}" if args.run_dir else "run dir chosen by the script"
        print(f"paratrain run: {plan.describe()}; {where}", flush=True)
        if args.run_dir is not None:  # a previous job's hang report would be taken for this one's
            shutil.rmtree(RunDir(args.run_dir).stacks, ignore_errors=True)
        for note in plan.notes:
            print(f"paratrain run: note: {note}", flush=True)
        ranks = RankTracebacks()
        oom_before = oom_kills()  # a SIGKILLed rank is then told apart: OOM killer or not
        code, stopped_by, output = supervise(
            plan.argv, {**os.environ, **plan.env}, tracebacks=ranks
        )
        preempted = preemption_note(report)
        if preempted is not None:  # the ranks saved and stopped: a signal asked them to
            print(f"paratrain run: {preempted}", file=sys.stderr, flush=True)
            return PREEMPTED_EXIT
        if code == 0:  # every rank finished, also when a signal came as they did
            if stopped_by is not None:
                print(
                    f"paratrain run: got {stopped_by.name} as the ranks were finishing; every "
                    "rank finished, so the job succeeded",
                    file=sys.stderr,
                    flush=True,
                )
            return 0
        if stopped_by is not None:
            print(f"paratrain run: {STOPPED[stopped_by][0]}", file=sys.stderr, flush=True)
            return STOPPED[stopped_by][1]
        run_dir = reported_run_dir(report, known=args.run_dir)
    text = failure_message(
        code,
        output,
        run_dir,
        args.max_restarts,
        node_rank=plan.node_rank,
        tracebacks=ranks.own,
        unprefixed=ranks.unprefixed,
        oom_kills_before=oom_before,
    )
    raise JobFailedError(text, exit_code=exit_status(code, root_failure(output), ranks.own))
