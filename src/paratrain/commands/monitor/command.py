"""``paratrain monitor [RUN_DIR] [--once] [--interval 2] [--json]``.

paratrain monitor runs/exp          # live view of every rank of that job, refreshed
paratrain monitor --once            # one snapshot of the GPUs (or CPU) and exit
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from paratrain.commands.cli_types import positive_seconds
from paratrain.core.paths import existing
from paratrain.core.run_dir import RunDir
from paratrain.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain monitor``."""
    p = subparsers.add_parser(
        "monitor",
        help="live per-GPU and per-rank view of a running job",
        description=DESCRIPTION,
    )
    p.add_argument(
        "run_dir",
        nargs="?",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="the job's run dir (its stats/rank*.jsonl files); without it, only this machine",
    )
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument(
        "--interval",
        type=positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between refreshes (default: 2)",
    )
    p.add_argument(
        "--json", action="store_true", help="print one snapshot as JSON, for scripts, and exit"
    )
    p.set_defaults(handler=run_monitor)


DESCRIPTION = (
    "Live per-GPU and per-rank view of a running job: step time, samples/s, data wait and "
    "memory of every rank (from the stats files each rank writes when stats_every is set), GPU "
    "and CPU use of this machine, and flags for stragglers, input-bound ranks, memory imbalance "
    "and idle GPUs. Without RUN_DIR it shows this machine only."
)
JOB_HINT = "to watch a job's ranks, point the monitor at its run dir: paratrain monitor RUN_DIR"


def _number(value: Any, form: str, scale: float = 1.0) -> str:
    """``value`` (times ``scale``) in ``form``, or "-" when the stats did not have it."""
    return "-" if value is None else format(value * scale, form)


def render(snap: dict[str, Any]) -> Any:
    """Rich renderables for one snapshot."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = []
    if snap["gpus"]:
        gpus = Table(title="GPUs")
        for col in ("gpu", "name", "util %", "memory MB", "power W", "temp C"):
            gpus.add_column(col)
        for g in snap["gpus"]:
            gpus.add_row(
                str(g["index"]),
                g["name"],
                str(g["utilization"]),
                f"{g['memory_used_mb']:.0f}/{g['memory_total_mb']:.0f}",
                f"{g['power_w']:.0f}",
                str(g["temperature_c"]),
            )
        parts.append(gpus)
    elif snap.get("gpu_note"):
        parts.append(Text(snap["gpu_note"]))  # not markup: "[gpu]" is no style
    for note in snap.get("notes", []):
        parts.append(Text(f"note: {note}"))
    procs = {p["rank"]: p for p in snap["processes"]}
    if snap["ranks"] or snap["processes"]:
        # A Text title: a run dir named like "[x]" is no markup.
        ranks = Table(title=Text(f"ranks of {snap['run_dir']}" if snap["run_dir"] else "ranks"))
        for col in RANK_COLUMNS:
            ranks.add_column(col)
        if not snap["ranks"]:  # no run dir: the rank processes found on this machine
            for p in snap["processes"]:
                ranks.add_row(str(p["rank"]), *["-"] * 5, *_process(p), "now")
        for r in snap["ranks"]:
            ranks.add_row(
                str(r["rank"]),
                "-" if r.get("step") is None else str(r["step"]),
                _number(r.get("step_time_s"), ".1f", 1000),
                _number(r.get("samples_per_s"), ".0f"),
                _number(r.get("data_wait_fraction"), ".0%"),
                _number(r.get("peak_memory_mb"), ".0f"),
                *(_process(procs[r["rank"]]) if r["rank"] in procs else ("exited", "-")),
                "-" if r.get("age_s") is None else f"{r['age_s']:.0f}s ago",
            )
        parts.append(ranks)
    elif snap["run_dir"]:
        parts.append(Text(f"no rank has written stats to {snap['run_dir']}/stats yet"))
    else:
        parts.append(Text(f"no job found on this machine; {JOB_HINT}"))
    if snap["flags"]:
        flags = Table(title="flags")
        for col in ("flag", "where", "detail", "hint"):
            flags.add_column(col)
        for f in snap["flags"]:
            flags.add_row(f["flag"], f["where"], f["detail"], f["hint"])
        parts.append(flags)
    elif snap["ranks"]:
        parts.append("no flags: no straggler, input-bound rank, memory imbalance or idle GPU")
    parts.append(f"host: CPU {snap['cpu_percent']:.0f}%, memory {snap['memory_percent']:.0f}%")
    if not snap["run_dir"] and (snap["ranks"] or snap["processes"]):
        parts.append(Text(JOB_HINT))
    return Group(*parts)


RANK_COLUMNS = (
    "rank",
    "step",
    "step ms",
    "samples/s",
    "data wait",
    "peak MB",
    "CPU %",
    "RSS MB",
    "updated",
)


def _process(p: dict[str, Any]) -> tuple[str, str]:
    return f"{p['cpu_percent']:.0f}", f"{p['rss_mb']:.0f}"


def console() -> Any:
    """A rich console as wide as the terminal; piped, as wide as ``COLUMNS`` or 160 columns."""
    from paratrain.commands.tables import table_console

    return table_console()


def check_run_dir(run_dir: Path) -> None:
    """A ``ConfigError`` naming the fix unless ``run_dir`` is a folder with a ``stats/`` folder."""
    from paratrain.commands.monitor.snapshot import printable

    shown = printable(run_dir)
    if not existing(run_dir, "RUN_DIR").is_dir():
        raise ConfigError(
            f"RUN_DIR {shown} is a file, not a folder. Pass the run dir of a paratrain job (its "
            "run_dir setting, default runs/paratrain): paratrain monitor runs/paratrain."
        )
    if not RunDir(run_dir).stats.is_dir():
        raise ConfigError(
            f"{shown} has no stats/ folder. Pass the run dir of a paratrain job (its "
            "run_dir setting, default runs/paratrain), started with stats_every set."
        )


def run_monitor(args: argparse.Namespace) -> int:
    """Show snapshots until interrupted (or once)."""
    from rich.live import Live

    from paratrain.commands.monitor.snapshot import snapshot

    if args.run_dir is not None:
        check_run_dir(args.run_dir)
    if args.interval <= 0:
        raise ConfigError(f"--interval must be > 0 seconds, got {args.interval}.")
    if args.json:
        print(json.dumps(snapshot(args.run_dir), indent=2))
        return 0
    out = console()
    if args.once:
        out.print(render(snapshot(args.run_dir)))
        return 0
    try:
        with Live(render(snapshot(args.run_dir)), console=out, auto_refresh=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(render(snapshot(args.run_dir)), refresh=True)
    except KeyboardInterrupt:
        return 0
