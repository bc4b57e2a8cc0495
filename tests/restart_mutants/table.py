"""``paratrain verify-resume`` against restart-safe scripts and their planted mutants: a table.

    python tests/restart_mutants/table.py tests/restart_mutants/TABLE.md          # everything
    python tests/restart_mutants/table.py out.md --nproc 1 --only safe_gan mutant_untracked_ema

Every script of ``scripts/`` is verified with ``python -m paratrain verify-resume --nproc N --kills
K --json SCRIPT`` (in a temporary folder, ``PYTHONPATH`` the repository's ``src`` and root,
``OMP_NUM_THREADS=1``) at 1 and 2 ranks; the mutants that are only defects at several ranks
(:data:`SEVERAL_RANKS_ONLY`) at 2 ranks only. ``safe_*.py`` are restart-safe scripts in the shapes
users write; each ``mutant_*.py`` is a copy of one of them with one planted restart defect, named
in its docstring with the state expected to differ first.

Verdicts: ``safe`` (exit code 0: every killed run ended as the uninterrupted run), ``DIFFERS`` (exit
code 1: a killed run ended elsewhere), ``did not finish`` (exit code 1: a killed run crashed or
hung after its restart), ``not deterministic`` or ``failed`` (exit code 1: the two uninterrupted
runs differ, or the script fails on its own), ``usage error`` (exit code 2). A mutant judged
``safe`` is a false pass; a safe script judged anything else is a false alarm.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
ROOT = HERE.parents[1]

SEVERAL_RANKS_ONLY = frozenset({"mutant_rank0_best.py", "mutant_replicated_stat.py"})
"""Mutants whose defect is a per-rank value taken as rank 0's: safe at 1 rank by construction."""

KILLS = 3
TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Case:
    """One script at one world size."""

    script: Path
    nproc: int

    @property
    def name(self) -> str:
        return self.script.name

    @property
    def kind(self) -> str:
        return "mutant" if self.script.name.startswith("mutant_") else "safe"

    @property
    def id(self) -> str:
        return f"{self.script.stem}-{self.nproc}rank"

    def expected_difference(self) -> str | None:
        """The path a mutant's docstring names as the first to differ (None for a safe script)."""
        doc = ast.get_docstring(ast.parse(self.script.read_text())) or ""
        found = re.search(r"Expected first\s+difference:.*?``([^`]+)``", doc, re.S)
        return found.group(1) if found else None


@dataclass
class Result:
    """What verify-resume said about one case."""

    case: Case
    code: int
    verdict: str
    first_difference: str
    difference_path: str | None
    kills_differing: int
    kills: int
    seconds: float
    report: dict[str, Any] | None
    stderr: str

    @property
    def judged_safe(self) -> bool:
        return self.verdict == "safe"

    @property
    def correct(self) -> bool:
        return self.judged_safe == (self.case.kind == "safe")

    @property
    def outcome(self) -> str:
        if self.correct:
            return "ok"
        return "FALSE PASS" if self.case.kind == "mutant" else "FALSE ALARM"


def scripts() -> list[Path]:
    """Every script: the safe ones first, then the mutants, each by name."""
    found = sorted(SCRIPTS.glob("safe_*.py")) + sorted(SCRIPTS.glob("mutant_*.py"))
    return found


def cases(nprocs: tuple[int, ...] = (1, 2), only: list[str] | None = None) -> list[Case]:
    """Every (script, world size) to verify, in table order."""
    chosen = []
    for script in scripts():
        if only and script.stem not in only and script.name not in only:
            continue
        for nproc in nprocs:
            if nproc == 1 and script.name in SEVERAL_RANKS_ONLY:
                continue
            chosen.append(Case(script, nproc))
    return chosen


def environment() -> dict[str, str]:
    path = os.pathsep.join(
        p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def verify(
    case: Case, *, kills: int = KILLS, timeout_s: float = TIMEOUT_S, keep: Path | None = None
) -> Result:
    """Run ``paratrain verify-resume`` on ``case`` in a temporary folder (or, to look at the
    runs afterwards, in ``keep/<case id>``) and read its verdict."""
    command = [
        sys.executable,
        "-m",
        "paratrain",
        "verify-resume",
        "--nproc",
        str(case.nproc),
        "--kills",
        str(kills),
        "--json",
        str(case.script),
    ]
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if keep is None:
            cwd = stack.enter_context(tempfile.TemporaryDirectory(prefix="restart-mutants-"))
        else:
            cwd = str(keep / case.id)
            shutil.rmtree(cwd, ignore_errors=True)
            Path(cwd).mkdir(parents=True)
        try:
            proc = subprocess.run(
                command,
                cwd=cwd,
                env=environment(),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                start_new_session=True,  # torchrun signals its own process group, not ours
            )
            code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as err:
            code, stdout = -1, ""
            stderr = f"verify-resume did not end within {timeout_s:.0f} s\n{err.stderr or ''}"
    seconds = time.perf_counter() - started
    return read_result(case, code, stdout, stderr, seconds)


def read_result(case: Case, code: int, stdout: str, stderr: str, seconds: float) -> Result:
    """The verdict from verify-resume's exit code and JSON report."""
    try:
        report: dict[str, Any] | None = json.loads(stdout)
    except ValueError:
        report = None
    runs = report["runs"] if report else []
    differing = [r for r in runs if r["result"] != "match"]
    path = None
    if report is None:
        verdict = "usage error" if code == 2 else f"exit code {code}"
        first = _last_paragraph(stderr)
    elif report.get("straight_run_failed"):
        verdict = "failed"
        first = report["straight_run_failed"]["failure"]
    elif report.get("nondeterminism"):
        verdict = "not deterministic"
        n = report["nondeterminism"]
        path, first = n["path"], f"{n['path']}: {n['detail']}"
    elif code == 0 and not differing:
        verdict, first = "safe", ""
    elif any(r["result"] == "DIFFERS" for r in differing):
        verdict = "DIFFERS"
        run = next(r for r in differing if r["result"] == "DIFFERS")
        d = run["first_difference"]
        path = d["path"]
        first = f"{d['path']}: {d['detail']} (kill {run['kill_point']})"
    else:
        verdict = differing[0]["result"] if differing else f"exit code {code}"
        first = f"kill {differing[0]['kill_point']}" if differing else ""
    return Result(
        case=case,
        code=code,
        verdict=verdict,
        first_difference=first,
        difference_path=path,
        kills_differing=len(differing),
        kills=len(runs),
        seconds=seconds,
        report=report,
        stderr=stderr,
    )


def _last_paragraph(text: str) -> str:
    paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    return " ".join(paragraphs[-1].split())[:300] if paragraphs else ""


def markdown(results: list[Result], *, kills: int, wall_s: float) -> str:
    """The table, then the summary."""
    lines = [
        f"# paratrain verify-resume: restart-safe scripts and planted mutants (--kills {kills})",
        "",
        _versions(),
        "",
        "| script | kind | ranks | verdict | kills differing | first difference | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        verdict = r.verdict if r.correct else f"{r.verdict} ({r.outcome})"
        first = r.first_difference.replace("|", "\\|")
        lines.append(
            f"| {r.case.name} | {r.case.kind} | {r.case.nproc} | {verdict} | "
            f"{r.kills_differing}/{r.kills} | {first} | {r.seconds:.0f} |"
        )
    false_passes = [r for r in results if r.outcome == "FALSE PASS"]
    false_alarms = [r for r in results if r.outcome == "FALSE ALARM"]
    mutants = sum(r.case.kind == "mutant" for r in results)
    safe = len(results) - mutants
    lines += [
        "",
        f"False passes (mutant judged safe): {len(false_passes)} of {mutants}"
        + _names(false_passes)
        + f". False alarms (safe script judged unsafe): {len(false_alarms)} of {safe}"
        + _names(false_alarms)
        + ".",
        "",
        f"{len(results)} verify-resume runs in {wall_s / 60:.1f} min.",
        "",
    ]
    return "\n".join(lines)


def _versions() -> str:
    """paratrain's version and commit, torch's version, the CPU cores."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import paratrain, torch; print(paratrain.__version__, torch.__version__)",
        ],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=120,
    ).stdout.split()
    paratrain, torch = probe if len(probe) == 2 else ("?", "?")
    at = f" (commit {commit})" if commit else ""
    cores = os.cpu_count()
    return f"paratrain {paratrain}{at}, torch {torch}, {cores} CPU cores, CPU ranks over gloo."


def _names(results: list[Result]) -> str:
    if not results:
        return ""
    return " (" + ", ".join(f"{r.case.name} at {r.case.nproc} rank(s)" for r in results) + ")"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output", type=Path, help="where to write the markdown table")
    parser.add_argument("--kills", type=int, default=KILLS)
    parser.add_argument("--nproc", default="1,2", help="world sizes, e.g. 1,2 (default)")
    parser.add_argument("--only", nargs="*", help="script names (with or without .py)")
    parser.add_argument("--json", type=Path, help="also write every report here")
    parser.add_argument("--keep", type=Path, help="keep every case's runs under this folder")
    args = parser.parse_args(argv)
    nprocs = tuple(int(n) for n in args.nproc.split(","))
    chosen = cases(nprocs, args.only)
    started = time.perf_counter()
    results = []
    for i, case in enumerate(chosen, 1):
        result = verify(case, kills=args.kills, keep=args.keep)
        results.append(result)
        print(
            f"[{i}/{len(chosen)}] {case.name} x{case.nproc}: {result.verdict} "
            f"({result.outcome}) {result.seconds:.0f} s {result.first_difference}",
            file=sys.stderr,
            flush=True,
        )
    wall_s = time.perf_counter() - started
    args.output.write_text(markdown(results, kills=args.kills, wall_s=wall_s))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        "script": r.case.name,
                        "nproc": r.case.nproc,
                        "verdict": r.verdict,
                        "outcome": r.outcome,
                        "exit_code": r.code,
                        "seconds": round(r.seconds, 1),
                        "report": r.report,
                        "stderr_tail": r.stderr[-3000:],
                    }
                    for r in results
                ],
                indent=1,
            )
        )
    for line in args.output.read_text().splitlines():
        if line.startswith("False passes") or line.endswith(" min."):
            print(line, file=sys.stderr)
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
