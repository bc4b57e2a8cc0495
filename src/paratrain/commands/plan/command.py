"""``paratrain plan [--nproc N] [--gpu-memory SIZE | --gpu NAME] [--json] SCRIPT [ARGS...]``: each
rank's peak memory under each strategy, before launch, without a GPU and without real memory.

    paratrain plan --nproc 8 --gpu H100 train.py --batch-size 16
    paratrain plan --nproc 4 --gpu-memory 24GiB --json train.py

Runs SCRIPT in one process on fake tensors (shapes, no memory) up to its first optimizer step:
its own model, optimizer, per-rank batch, loss, precision and accumulation. The step is measured
by torch's MemTracker, and the strategies for N ranks are derived from it (ddp: plus DDP's
gradient buckets; fsdp with and without reshard-after-forward: the model sharded by paratrain's
own units over a fake process group, two steps replayed; ddp and fsdp with the script's repeated
blocks checkpointed: its second step measured with them recomputed; with a GPU memory given, fsdp
with its state offloaded to the host). Prints, per strategy, the peak per rank split into
parameters, gradients, optimizer state, activations and communication buffers, and the strategy
to use for the given memory. See docs/howto/plan.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from paratrain.commands.cli_types import memory_size, positive_int
from paratrain.errors import ConfigError

GPUS = {"H200": 141, "H100": 80, "A100": 80, "A100-40GB": 40, "L40S": 48, "A10G": 24, "L4": 24}
"""Memory of well-known cards, in GB as sold (``--gpu``); ``--gpu-memory`` for any other."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain plan``."""
    p = subparsers.add_parser(
        "plan",
        help="peak memory per rank under each strategy, before launch",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--nproc", type=positive_int, default=1, help="ranks of the job (default 1)")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--gpu-memory", type=memory_size, metavar="SIZE", help="memory of one device, e.g. 80GiB"
    )
    size.add_argument(
        "--gpu", choices=sorted(GPUS), help="a card whose memory to plan for (--gpu-memory: any)"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...]")
    p.set_defaults(handler=plan_command)


def plan_command(args: argparse.Namespace) -> int:
    """Plan, show; exit 0 when a strategy fits (or no memory was given), 1 when none does."""
    target = list(args.target[1:] if args.target[:1] == ["--"] else args.target)
    if not target or target[0].startswith("-"):
        raise ConfigError(
            "Nothing to plan: give the training script after the options, e.g. `paratrain plan "
            "--nproc 4 --gpu H100 train.py --batch-size 16`."
        )
    if not Path(target[0]).is_file():
        raise ConfigError(f"No such script: {target[0]}. Give the path of the training script.")
    capacity = args.gpu_memory or (GPUS[args.gpu] * 10**9 if args.gpu else None)
    # A device memory to plan for means GPU ranks: the one-process row is `single`, and
    # fsdp with its state in host memory (`fsdp_offload`, CUDA only) is a row too.
    plan = run_plan(target, args.nproc, "cuda" if capacity else "cpu")
    if "error" in plan:
        raise ConfigError(
            f"`paratrain plan` could not run {target[0]} on fake tensors: {plan['error']} at "
            f"{plan['where']}. A fake tensor has a shape but no values: a value read before the "
            "first optimizer step as a NumPy array, or an op whose output shape depends on values "
            "(`nonzero`, `masked_select`), cannot be planned (`.item()`, `.tolist()`, `float()`, "
            "an index or a truth value read a placeholder in a plan). "
            "Move that read after the first `run.step(...)`."
            if "where" in plan
            else f"`paratrain plan` could not plan {target[0]}: {plan['error']}."
        )
    from paratrain.commands.plan.memory import Breakdown, recommend

    rows = [Breakdown(**{k: v for k, v in r.items() if k != "total"}) for r in plan["rows"]]
    best, why = recommend(rows, capacity)
    plan["capacity"] = capacity
    plan["recommended"] = best.strategy if best else None
    plan["why"] = why
    if args.json:
        print(json.dumps(plan, indent=2))
    else:
        show(plan, rows)
    return 0 if best is not None else 1


def run_plan(target: list[str], nproc: int, accelerator: str = "cpu") -> dict[str, Any]:
    """The plan from :mod:`paratrain.commands.plan.fake_run`, in a process of its own."""
    with tempfile.TemporaryDirectory(prefix="paratrain-plan-") as folder:
        out = Path(folder) / "plan.json"
        command = [sys.executable, "-m", "paratrain.commands.plan.fake_run", "--out", str(out),
                   "--nproc", str(nproc), "--accelerator", accelerator, "--", *target]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if not out.exists():
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            return {"error": f"the planning process exited with {done.returncode}:\n{tail}"}
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def show(plan: dict[str, Any], rows: list[Any]) -> None:
    """The plan as a table and the recommendation."""
    from rich.table import Table

    from paratrain.commands.tables import table_console

    biggest = max((row.total for row in rows), default=0)
    unit, scale = ("GiB", 2**30) if biggest >= 2**30 else ("MiB", 2**20)

    def size(n: int) -> str:
        return f"{n / scale:,.2f}"

    table = Table(
        title=f"paratrain plan: {Path(plan['script']).name}, {plan['nproc']} rank(s), "
        f"{plan['parameters']:,} parameters; {unit} per rank at its peak"
    )
    for column in ("strategy", "parameters", "gradients", "optimizer", "activations",
                   "communication", "peak"):  # fmt: skip
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in rows:
        fits = plan["capacity"] is None or row.total <= plan["capacity"]
        table.add_row(
            row.strategy,
            *(
                size(getattr(row, name))
                for name in ("parameters", "gradients", "optimizer", "activations", "communication")
            ),
            size(row.total) if fits else f"[red]{size(row.total)}",
        )
    console = table_console()
    console.print(table)
    console.print(f"recommended: {plan['recommended'] or 'none'}: {plan['why']}", soft_wrap=True)
    console.print(
        f"planned in {plan['seconds']:.1f} s on fake tensors; the allocator's own overhead is not "
        "included (on CUDA leave 5-10 % free)",
        soft_wrap=True,
    )
