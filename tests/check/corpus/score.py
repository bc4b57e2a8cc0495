"""Precision and recall of every ``paratrain check`` rule on the corpus beside this file.

    python -m tests.check.corpus.score          # the table in docs/rules/index.md
    python -m tests.check.corpus.score --misses # and every miss and false alarm, by script

``clean/`` holds correct training scripts: any finding there is a false alarm. ``planted/``
holds scripts with exactly one mistake each, of the rule their name starts with
(``pt005_deit_engine.py``), on the line that ends with ``# planted: PT005``: a finding of that
rule anywhere in the script counts as found, a finding of any other rule is a false alarm. A
top-level script is checked alone; a folder (``clean/deit/``) is checked as one project, its
modules seeing each other's functions.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from paratrain.commands.check.engine import check_paths, rules_by_id
from paratrain.commands.check.findings import Finding

HERE = Path(__file__).resolve().parent
PLANTED = re.compile(r"^pt(\d{3})_", re.IGNORECASE)
IMPLIED = {"PT013": {"PT014"}}
"""Rules a planted mistake cannot go without: SyncBatchNorm under DataParallel uses DataParallel."""


@dataclass
class Score:
    """Counts over the corpus, by rule."""

    planted: Counter[str] = field(default_factory=Counter)
    found: Counter[str] = field(default_factory=Counter)
    false: Counter[str] = field(default_factory=Counter)
    misses: list[str] = field(default_factory=list)
    """``path: PT005 not found``."""
    alarms: list[Finding] = field(default_factory=list)
    """Findings on clean scripts and findings of other rules on planted ones."""
    clean: int = 0

    def precision(self, rule: str) -> float | None:
        hits = self.found[rule] + self.false[rule]
        return self.found[rule] / hits if hits else None

    def recall(self, rule: str) -> float | None:
        return self.found[rule] / self.planted[rule] if self.planted[rule] else None


def _units(folder: Path) -> list[list[Path]]:
    """Top-level scripts one by one; each sub-folder as one project."""
    units: list[list[Path]] = []
    for entry in sorted(folder.iterdir()):
        if entry.suffix == ".py" or (entry.is_dir() and not entry.name.startswith((".", "_"))):
            units.append([entry])
    return units


def score(root: Path = HERE) -> Score:
    """Check every script of the corpus and count."""
    result = Score()
    for unit in _units(root / "clean"):
        report = check_paths(unit)
        result.clean += report.files
        result.alarms += report.findings
        for f in report.findings:
            result.false[f.rule] += 1
    for unit in _units(root / "planted"):
        report = check_paths(unit)
        match = PLANTED.match(unit[0].name)
        if match is None:
            raise SystemExit(f"{unit[0]}: a planted script's name starts with ptNNN_")
        rule = f"PT{match.group(1)}"
        result.planted[rule] += 1
        if any(f.rule == rule for f in report.findings):
            result.found[rule] += 1
        else:
            result.misses.append(f"{unit[0].relative_to(root)}: {rule} not found")
        for f in report.findings:
            if f.rule != rule and f.rule not in IMPLIED.get(rule, set()):
                result.false[f.rule] += 1
                result.alarms.append(f)
    return result


def table(result: Score) -> str:
    """A markdown table: rule, planted, found, false alarms, precision, recall."""

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    rows = [
        "| rule | planted | found | false alarms | precision | recall |",
        "|---|---|---|---|---|---|",
    ]
    for rule in rules_by_id():
        rows.append(
            f"| {rule} | {result.planted[rule]} | {result.found[rule]} | {result.false[rule]} "
            f"| {pct(result.precision(rule))} | {pct(result.recall(rule))} |"
        )
    planted = sum(result.planted.values())
    found = sum(result.found.values())
    false = sum(result.false.values())
    precision = found / (found + false) if found + false else None
    recall = found / planted if planted else None
    rows.append(f"| all | {planted} | {found} | {false} | {pct(precision)} | {pct(recall)} |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    result = score()
    print(f"{result.clean} clean scripts, {sum(result.planted.values())} with one planted mistake")
    print(table(result))
    if "--misses" in argv:
        for miss in result.misses:
            print("MISS ", miss)
        for f in result.alarms:
            print(f"FALSE {Path(f.path).relative_to(HERE)}:{f.line}: {f.rule} {f.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
