"""Show a verify-resume report: a rich table with the cost beside it, or JSON.

show(report)                   # table of killed runs, then the times and the verdict
print(as_json(report))
"""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from paratrain.commands.tables import table_console
from paratrain.commands.verify.compare import Difference
from paratrain.commands.verify.kill_points import DESCRIPTIONS
from paratrain.commands.verify.report import Report

STYLE = {"match": "green", "DIFFERS": "bold red"}

NOT_DETERMINISTIC = (
    "the script is not deterministic: two uninterrupted runs with the same arguments ended in "
    "different states, so a killed run cannot be checked against them and resume is not to "
    "blame. First difference: {difference}. Usual causes: a seed taken from the time or the "
    "process id, a generator never seeded (torch.Generator(), np.random.default_rng(), "
    "random.Random()), data order from a set or os.listdir, or a non-deterministic kernel (on "
    "GPU: torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8). Fix "
    "the cause, or pass --atol X to accept differences up to X."
)


FILE_NAMES_DIFFER = (
    "the files matched by --compare-files {pattern!r} have other names in two uninterrupted runs "
    "of the same command ({difference}), so they cannot be compared: a name carries a time, a "
    "process id or a random part. The script may well be deterministic. Give --compare-files a "
    "pattern that matches only files with fixed names, or name the file after the step or "
    "epoch instead."
)


def not_deterministic(difference: Difference, pattern: str | None) -> str:
    """Why two uninterrupted runs cannot serve as the reference: their files are named
    differently, or their states differ."""
    if difference.path.startswith("files/") and difference.detail.startswith("only in the"):
        return FILE_NAMES_DIFFER.format(pattern=pattern, difference=difference)
    return NOT_DETERMINISTIC.format(difference=difference)


def as_json(report: Report) -> str:
    """The whole report as JSON."""
    return json.dumps(report.to_json(), indent=2)


def show(report: Report, console: Console | None = None) -> None:
    """Print the report as a table, the times and the verdict."""
    console = console or table_console()
    script = " ".join(report.options.target)
    if report.failed is not None:
        failed = report.failed
        console.print(
            f"[bold red]verify-resume: the uninterrupted run of {escape(script)} failed on its "
            f"own ({escape(failed.failure())}), before anything was killed.[/] Its output ends "
            "with:"
        )
        console.print(failed.tail(), markup=False, highlight=False)
        console.print(f"Full output: {escape(str(failed.files.output))}. Fix the script first.")
        return
    if report.nondeterminism is not None:
        text = not_deterministic(report.nondeterminism, report.options.compare_files)
        console.print(f"[bold red]verify-resume: {escape(text)}")
        _times(report, console)
        return
    title = f"verify-resume: {escape(script)} ({report.options.nproc} rank(s))"
    if console.is_terminal:
        console.print(_table(report, title))
    else:  # a log or a pipe: one block per kill, each line whole however long its difference
        console.print(title)
        for k in report.kills:
            style = STYLE.get(k.result, "bold red")
            console.print(
                f"  kill {k.choice.point.event} #{k.choice.point.n} on rank {k.choice.point.rank}"
                f" (step {k.step}, epoch {k.epoch}), resumed from {_resumed(k.resumed_from)}: "
                f"[{style}]{k.result}[/] in {k.seconds:.1f} s",
                soft_wrap=True,
            )
            if k.difference:
                console.print(f"    first difference: {escape(str(k.difference))}", soft_wrap=True)
    kinds = dict.fromkeys(k.choice.point.event for k in report.kills)
    console.print(
        "kill points: " + "; ".join(f"{kind}: {DESCRIPTIONS[kind]}" for kind in kinds),
        highlight=False,
    )
    for k in report.kills:
        if k.tail is not None:
            console.print(f"[bold red]{escape(str(k.run_dir))} did not finish;[/] its output ends:")
            console.print(k.tail, markup=False, highlight=False)
    _times(report, console)
    bad = [k for k in report.kills if k.result != "match"]
    if bad:
        console.print(
            f"[bold red]verify-resume: {len(bad)} of {len(report.kills)} killed run(s) did not end "
            "as the uninterrupted run.[/] A difference names the state that was lost (a weight, "
            "an optimizer value, a counter): something the script keeps outside what pt.Run "
            "saves (a plain variable, an unregistered object: register it with run.track) or "
            "a resume defect. Each run's output is in its run dir's verify-resume/output.log."
        )
    else:
        atol = report.options.atol
        how = "bit for bit" if atol == 0 else f"within {atol:g}"
        console.print(
            f"[green]verify-resume: every killed run ended as the uninterrupted run, {how}."
        )


def _resumed(resumed: int | str | None) -> str:
    return "-" if resumed is None else f"step {resumed}" if isinstance(resumed, int) else resumed


def _table(report: Report, title: str) -> Table:
    """The kills as a table, for a terminal (its width is known)."""
    table = Table(title=title)
    for column in ("kill point", "rank", "step", "epoch", "resumed from", "result"):
        table.add_column(column, no_wrap=True)
    table.add_column("first difference", overflow="fold")
    table.add_column("time", justify="right", no_wrap=True)
    for k in report.kills:
        style = STYLE.get(k.result, "bold red")
        table.add_row(
            f"{k.choice.point.event} #{k.choice.point.n}",
            str(k.choice.point.rank),
            str(k.step),
            str(k.epoch),
            _resumed(k.resumed_from),
            f"[{style}]{k.result}",
            escape(str(k.difference)) if k.difference else "",
            f"{k.seconds:.1f} s",
        )
    return table


def _times(report: Report, console: Console) -> None:
    straight = report.straight_s[0] if report.straight_s else 0.0
    ratio = f" = {report.total_s / straight:.1f} x one run" if straight else ""
    console.print(
        f"uninterrupted run {straight:.1f} s; verify-resume {report.total_s:.1f} s{ratio}"
    )
