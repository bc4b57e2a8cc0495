"""``paratrain check``: find multi-GPU mistakes in training scripts, without running them.

    paratrain check train.py                     # path:line:col: PT001 ..., exit 1 if found
    paratrain check examples/ --select PT001,PT006
    paratrain check . --ignore PT014 --json      # a JSON list of findings
    paratrain check . --sarif > check.sarif      # SARIF 2.1.0 for code-scanning uploads
    paratrain check train.py --diff              # what --fix would rewrite, as a diff
    paratrain check train.py --fix               # rewrite it, print the diff, report the rest

Exit codes: 0 nothing found, 1 findings, 2 a usage error or a script that cannot be parsed
(reported as ``paratrain: error: path:line:col: cannot parse: ...``; the rest is still checked).
Silence one line with ``# paratrain: ignore[PT001]`` (or ``# paratrain: ignore`` for all rules).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from paratrain.commands.check.engine import check_paths, rules_by_id
from paratrain.commands.check.fixes import FIXABLE, plan, unified, write
from paratrain.commands.check.render import as_json, as_sarif, as_text
from paratrain.commands.check.walk import DEFAULT_EXCLUDE, Walk
from paratrain.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain check``."""
    summary = "; ".join(f"{r.id} {r.summary}" for r in rules_by_id().values())
    p = subparsers.add_parser(
        "check",
        help="find multi-GPU mistakes in training scripts (static, nothing is run)",
        description=__doc__.split("\n")[0],
        epilog=f"rules: {summary}",
    )
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a script or a folder (every *.py inside)")  # fmt: skip
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    form.add_argument("--sarif", action="store_true", help="print a SARIF 2.1.0 log")
    p.add_argument("--select", default=None, metavar="IDS",
                   help="only these rules, comma-separated (e.g. PT001,PT006)")  # fmt: skip
    p.add_argument("--ignore", default=None, metavar="IDS",
                   help="leave out these rules, comma-separated")  # fmt: skip
    p.add_argument(
        "--exclude",
        default=None,
        metavar="GLOBS",
        help="folders and files not to enter, comma-separated globs of a name or a path "
        f"relative to the folder named; replaces the default ({', '.join(DEFAULT_EXCLUDE)}; "
        "dot-folders, virtual environments and .gitignore'd paths are always left out)",
    )
    p.add_argument(
        "--extend-exclude",
        default=None,
        metavar="GLOBS",
        help="globs left out in addition to the default ones, comma-separated",
    )
    edit = p.add_mutually_exclusive_group()
    edit.add_argument(
        "--fix",
        action="store_true",
        help=f"rewrite the mechanical findings ({', '.join(sorted(FIXABLE))}) in "
        "place, print the diff, then report what is left",
    )
    edit.add_argument(
        "--diff",
        action="store_true",
        help="print the diff --fix would make and change nothing (exit 1 if any)",
    )
    p.set_defaults(handler=run_check)


def _globs(text: str | None) -> list[str] | None:
    return None if text is None else [g.strip() for g in text.split(",") if g.strip()]


def rule_ids(flag: str, text: str) -> set[str]:
    """The rule ids in ``--select``/``--ignore``'s value; unknown ids are a ConfigError."""
    known = rules_by_id()
    ids = {part.strip().upper() for part in text.split(",") if part.strip()}
    unknown = sorted(ids - known.keys())
    if unknown or not ids:
        got = ", ".join(unknown) if unknown else repr(text)
        raise ConfigError(
            f"{flag} {got}: not a rule id. Valid ids: {', '.join(known)} (comma-separated)."
        )
    return ids


def run_check(args: argparse.Namespace) -> int:
    """Check the scripts and print the report; 1 when something was found."""
    chosen = set(rules_by_id())
    if args.select is not None:
        chosen = rule_ids("--select", args.select)
    if args.ignore is not None:
        chosen -= rule_ids("--ignore", args.ignore)
    if any(not p.strip() for p in args.paths):  # Path("") would be the current folder
        raise ConfigError("paratrain check: got an empty path. Pass a .py file or a folder.")
    paths = [Path(p) for p in args.paths]
    walk = Walk(exclude=_globs(args.exclude), extend_exclude=_globs(args.extend_exclude) or ())
    report = check_paths(paths, select=chosen, walk=walk)
    planned = plan(report.findings)
    out = sys.stderr if args.json or args.sarif else sys.stdout  # keep the JSON parseable
    if args.diff or args.fix:
        for p in planned:
            print(unified(p.path, p.old, p.new), end="", file=out)
    if args.diff:
        return 1 if planned else 0
    if args.fix and planned:
        for p in planned:
            write(p)
        fixed = sum(len(p.fixed) for p in planned)
        print(f"Fixed {fixed} problem{'s' * (fixed != 1)} in {len(planned)} script(s).", file=out)
        report = check_paths(paths, select=chosen, walk=walk)
        planned = plan(report.findings)
    if args.sarif:
        rules = [r for r in rules_by_id().values() if r.id in chosen]
        print(json.dumps(as_sarif(report, rules), indent=2))
    elif args.json:
        print(json.dumps(as_json(report), indent=2))
    else:
        print(as_text(report, {k for p in planned for k in p.fixed}))
    for error in [*report.errors, *map(str, report.failures)]:
        print(f"paratrain: error: {error}", file=sys.stderr)
    if report.errors or report.failures:
        return 2
    return 1 if report.findings else 0
