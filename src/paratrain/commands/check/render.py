"""How a check report is written: ruff-like text, a JSON list, or SARIF 2.1.0 for code hosts.

print(as_text(report))
print(json.dumps(as_json(report), indent=2))
print(json.dumps(as_sarif(report, rules), indent=2))
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict
from typing import Any

from paratrain.commands.check.engine import Report
from paratrain.commands.check.findings import Rule
from paratrain.core.version import __version__

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def as_text(report: Report, fixable: Collection[tuple[str, str, int, int]] = ()) -> str:
    """``path:line:col: PT001 message``, the fix and the paratrain call below, then a count;
    ``[*]`` marks the findings in ``fixable`` ((path, rule, line, col) that ``--fix`` rewrites)."""
    out: list[str] = []
    for f in report.findings:
        mark = " [*]" if (f.path, f.rule, f.line, f.col) in fixable else ""
        out.append(f"{f.path}:{f.line}:{f.col}: {f.rule}{mark} {f.message}")
        out.append(f"    fix: {f.fix}")
        if f.api:
            out.append(f"    paratrain: {f.api}")
    named = max(report.named, report.files + len(report.errors))
    scripts = f"{named} script{'s' * (named != 1)}"
    unparsed = len(report.errors)
    notes = [f"{unparsed} could not be parsed"] if unparsed else []
    if report.failures:
        failed = len(report.failures)
        notes.append(f"{failed} rule failure{'s' * (failed != 1)}: see below")
    tail = f" ({'; '.join(notes)})" if notes else ""
    if report.findings:
        count = len(report.findings)
        where = len({f.path for f in report.findings})
        out.append(
            f"Found {count} problem{'s' * (count != 1)} in {where} of {scripts} checked{tail}."
        )
        marked = sum((f.path, f.rule, f.line, f.col) in fixable for f in report.findings)
        if marked:
            out.append(f"[*] {marked} fixable with --fix (see them first with --diff).")
    else:
        out.append(f"No problems found in {scripts} checked{tail}.")
    if report.skipped:
        shown = ", ".join(report.skipped[:8]) + (" ..." if len(report.skipped) > 8 else "")
        out.append(f"Not entered: {shown} (--exclude, --extend-exclude to change).")
    if report.test_modules:
        n = report.test_modules
        out.append(
            f"{n} test module{'s' * (n != 1)} (test_*.py, *_test.py, conftest.py) checked for "
            "deprecated and unsafe APIs only; name one on the command line for every rule."
        )
    return "\n".join(out)


def as_json(report: Report) -> list[dict[str, Any]]:
    """The findings as a list of objects (rule, path, line, col, message, fix, api), then one
    object per script that could not be parsed, with ``"rule": null`` (as ruff does), and one
    per rule that failed on a script, with ``"failure": true``."""
    found = [asdict(f) for f in report.findings]
    for err in report.unparsed:
        found.append(
            {
                "rule": None, "path": err.path, "line": err.line, "col": err.col,
                "message": err.problem, "fix": "make the file valid UTF-8 Python, or leave it "
                "out of the paths checked", "api": None,
            }
        )  # fmt: skip
    for failure in report.failures:
        found.append(
            {
                "rule": failure.rule, "path": failure.path, "line": 1, "col": 1,
                "message": f"{failure.rule} could not check this script ({failure.problem})",
                "fix": f"report it with the script, or silence it with --ignore {failure.rule}",
                "api": None, "failure": True,
            }
        )  # fmt: skip
    return found


def as_sarif(report: Report, rules: Sequence[Rule]) -> dict[str, Any]:
    """A SARIF 2.1.0 log with one run: the rules checked and a result per finding."""
    index = {r.id: i for i, r in enumerate(rules)}
    driver = {
        "name": "paratrain",
        "version": __version__,
        "rules": [
            {"id": r.id, "name": r.name, "shortDescription": {"text": r.summary}} for r in rules
        ],
    }
    results = [
        {
            "ruleId": f.rule,
            "ruleIndex": index[f.rule],
            "level": "warning",
            "message": {"text": f"{f.message}. Fix: {f.fix}"},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": f.path},
                        "region": {"startLine": f.line, "startColumn": f.col},
                    }
                }
            ],
        }
        for f in report.findings
    ]
    notes = [
        {
            "level": "error",
            "message": {"text": err.problem},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": err.path},
                        "region": {"startLine": err.line, "startColumn": err.col},
                    }
                }
            ],
        }
        for err in report.unparsed
    ]
    notes += [
        {
            "level": "error",
            "message": {"text": f"{f.rule} could not check this script ({f.problem})"},
            "descriptor": {"id": f.rule},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": f.path}}}],
        }
        for f in report.failures
    ]
    invocation = {"executionSuccessful": not notes, "toolExecutionNotifications": notes}
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{"tool": {"driver": driver}, "invocations": [invocation], "results": results}],
    }
