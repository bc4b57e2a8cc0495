"""``paratrain doctor [--quick] [--json]``: environment report, checks with fixes, measurements.

    paratrain doctor             # tables; exit code 1 when any check FAILs
    paratrain doctor --json      # the same data for scripts
    paratrain doctor --quick     # skip the measurements (about 2 s)

It imports torch late and catches everything, so it reports a broken torch instead of crashing.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain doctor``."""
    p = subparsers.add_parser(
        "doctor",
        help="check this machine and say how to fix problems",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--quick", action="store_true", help="skip the measurements")
    p.set_defaults(handler=run_doctor)


def build_report(*, quick: bool) -> dict[str, Any]:
    """Facts, checks and (unless quick) measurements, as data."""
    from paratrain.commands.doctor.checks import run_checks
    from paratrain.commands.doctor.facts import gather
    from paratrain.commands.doctor.measure import measure_all

    facts = gather()
    return {
        "facts": facts,
        "checks": [c.as_dict() for c in run_checks(facts)],
        "measurements": [] if quick else measure_all(facts),
    }


def run_doctor(args: argparse.Namespace) -> int:
    """Print the report; exit 1 when a check failed."""
    from paratrain.commands.doctor import render

    report = build_report(quick=args.quick)
    if args.json:
        print(render.as_json(report))
    else:
        render.show(report)
    return 1 if any(c["status"] == "FAIL" for c in report["checks"]) else 0
