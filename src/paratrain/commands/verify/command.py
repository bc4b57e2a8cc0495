"""``paratrain verify-resume [options] SCRIPT [ARGS...]``: prove a script restart-safe.

    paratrain verify-resume train.py --epochs 3            # 1 rank, 4 killed runs
    paratrain verify-resume --nproc 2 --kills 7 train.py   # 2 ranks, every kind of kill point
    paratrain verify-resume --compare-files best.pt --json train.py
    paratrain verify-resume --atol 1e-6 train.py           # non-deterministic kernels
    paratrain verify-resume -m pkg.train --lr 3e-4         # a module instead of a script

Runs SCRIPT to its end twice under ``paratrain run`` (the two must agree: else the script is not
deterministic, and that is reported instead of blaming resume), then once per kill point with
one rank SIGKILLed there and ``--max-restarts 1``, and compares every rank's final state, the
last checkpoint and the ``--compare-files`` with the first run, bit for bit unless ``--atol``.
Everything after SCRIPT is the script's. Exit code 0 when every killed run matches, 1 when one
differs or does not finish, or the script is not deterministic or fails on its own, 2 for a
usage error. See docs/concepts/verify-resume.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from paratrain.commands.cli_types import non_negative_float, non_negative_int, positive_int
from paratrain.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain verify-resume``."""
    p = subparsers.add_parser(
        "verify-resume",
        help="prove a script restart-safe: killed runs must end as the uninterrupted one",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("--nproc", type=positive_int, default=1, help="ranks of every run (default 1)")
    p.add_argument(
        "--kills", type=positive_int, default=4, help="killed runs, one per kill point (default 4)"
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="0: kill points spread from the middle of the run; else drawn with this seed",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=Path("runs/verify-resume"),
        help="folder of the runs' run dirs (default runs/verify-resume)",
    )
    p.add_argument(
        "--compare-files",
        default=None,
        metavar="GLOB",
        help="also compare these files under each run dir (e.g. best.pt)",
    )
    p.add_argument(
        "--atol",
        type=non_negative_float,
        default=0.0,
        help="allow max |Δ| up to this for floats (default 0: bit for bit)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATH",
        help="leave out state at this path (a glob of the path a difference names, e.g. "
        "'rank */extras/started'); repeatable",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        default=None,
        metavar="MODULE [ARGS]",
        help="verify a module (as python -m) instead of a script",
    )
    p.add_argument("target", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...]")
    p.set_defaults(handler=verify_command)


def verify_command(args: argparse.Namespace) -> int:
    """Run the verification and show it; the exit code says whether resume was proven."""
    from paratrain.commands.verify import render
    from paratrain.commands.verify.report import Options
    from paratrain.commands.verify.runner import verify

    target = ["-m", *args.module] if args.module else list(args.target)
    if target[:1] == ["--"]:
        target = target[1:]
    if not target or (target[0].startswith("-") and target[0] != "-m"):
        raise ConfigError(
            "Nothing to verify: give the training script after the options, e.g. `paratrain "
            "verify-resume --nproc 2 train.py --epochs 3` (everything after the script is "
            "passed to it)."
        )
    if args.compare_files is not None and (
        not args.compare_files or Path(args.compare_files).is_absolute()
    ):
        raise ConfigError(
            f"--compare-files {args.compare_files!r} must be a pattern relative to each run dir, "
            "e.g. --compare-files best.pt or --compare-files 'exports/*.pt'."
        )
    options = Options(
        target=target,
        nproc=args.nproc,
        kills=args.kills,
        seed=args.seed,
        run_dir=args.run_dir,
        compare_files=args.compare_files,
        atol=args.atol,
        exclude=tuple(args.exclude),
    )
    try:
        report = verify(options, say=_say)
    except KeyboardInterrupt:
        print("verify-resume: interrupted", file=sys.stderr, flush=True)
        return 130
    if args.json:
        print(render.as_json(report))
    else:
        render.show(report)
    return report.exit_code()


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
