"""Why a launched job failed, as a user needs it: which rank, what it raised and where, what to do.

    failed = root_failure(output)             # RankExit(rank=1, local_rank=1, exitcode=1)
    text = failure_message(code, output, run_dir, max_restarts, tracebacks=ranks.own)
    raise JobFailedError(text, exit_code=exit_status(code, failed))

A rank that raised exits the job with its own code (1 for an uncaught exception) and the message
names the exception and the script's ``file:line``; a rank killed by a signal exits with
128 + the signal, and only then is ``--max-restarts`` suggested: a restart cannot fix a bug.
"""

from __future__ import annotations

import json
import re
import signal
import sysconfig
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from paratrain.commands.run.rank_output import raised_at
from paratrain.core.run_dir import RunDir
from paratrain.distributed.environment import read_report
from paratrain.distributed.watchdog import diagnose
from paratrain.errors import lost_a_peer


@dataclass(frozen=True)
class RankExit:
    """How one rank ended, from torchrun's failure report."""

    rank: int
    local_rank: int
    exitcode: int
    """The process's exit code; negative: killed by that signal."""

    @property
    def signal(self) -> signal.Signals | None:
        """The signal that killed the rank, if one did."""
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode)
        except ValueError:
            return None

    def describe(self) -> str:
        """'rank 1 (local rank 1) was killed by SIGKILL' or '... exited with code 5'."""
        sig = self.signal
        how = f"was killed by {sig.name}" if sig else f"exited with code {self.exitcode}"
        return f"rank {self.rank} (local rank {self.local_rank}) {how}"


def root_failure(output: str) -> RankExit | None:
    """The rank that failed on its own, from torchrun's report at the end of ``output``.

    torchrun names the first failure it observed; when that rank only lost its peer (its output
    says so), the rank that failed on its own is named instead."""
    entries = _failures(output)
    if not entries:
        return None
    lost_peer = {e.rank for e in entries if _only_lost_its_peer(output, e.rank)}
    return next((e for e in entries if e.rank not in lost_peer), entries[0])


def _failures(output: str) -> list[RankExit]:
    """Every rank torchrun's failure report lists, the root cause first."""
    start = output.rfind("Failures:")
    root = output.rfind("Root Cause")
    if root < 0:
        return []
    return [
        RankExit(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        for block in (output[root:], output[start:root] if 0 <= start < root else "")
        for m in re.finditer(
            r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)", block
        )
    ]


def failure_summary(output: str) -> str | None:
    """'rank 1 (local rank 1) was killed by SIGKILL' from torchrun's failure report."""
    failed = root_failure(output)
    return failed.describe() if failed else None


def _only_lost_its_peer(output: str, rank: int) -> bool:
    lines = [line for line in output.splitlines() if line.startswith(f"[rank{rank}]:")]
    return any(lost_a_peer(line) for line in lines)


def exit_status(code: int, failed: RankExit | None, raised: Collection[int] = ()) -> int:
    """The exit code of ``paratrain run`` for a failed job: the failed rank's own code, 128 + the
    signal that killed it, else torchrun's; never 0, and never 2 (a usage error). A rank in
    ``raised`` (its traceback was shown) that torchrun then stopped with SIGTERM while it was
    exiting failed with its exception: 1."""
    if failed is not None:
        sig = failed.signal
        code = 128 + sig.value if sig else failed.exitcode
        if sig == signal.SIGTERM and failed.rank in raised:
            code = 1
    if code in (0, 2) or not 0 < code < 256:
        return 1
    return code


def _restarts_recorded(run_dir: Path | None) -> int | None:
    """Restarts the run recorded (``restarts.jsonl``: a line per restarted attempt that came as
    far as resuming); None when the run dir is unknown."""
    if run_dir is None:
        return None
    try:
        lines = RunDir(run_dir).restarts.read_text().splitlines()
    except OSError:
        return 0
    attempts = set()
    for line in lines:
        try:
            attempts.add(json.loads(line).get("restart"))
        except (ValueError, AttributeError):
            continue  # a line cut short
    return len(attempts)


def reported_run_dir(report: Path, *, known: Path | None) -> Path | None:
    """The run dir the script's Run reported, else ``--run-dir``, else None (unknown)."""
    record = read_report(report)
    reported = record.get("run_dir") if record else None
    return Path(reported) if isinstance(reported, str) else known


PREEMPTED_EXIT = 75
"""The exit code of a preempted job (``paratrain.runtime.preemption.PREEMPTED_EXIT``, which
this module does not import: it would bring torch into ``paratrain run --help``)."""


def preemption_note(report: Path) -> str | None:
    """'preempted at step N: ...' when the job's ranks saved and stopped on a preemption signal
    (the main process recorded it in the launcher report), else None."""
    record = read_report(report) or {}
    preempted = record.get("preempted")
    if not isinstance(preempted, dict):
        return None
    how = f" by {preempted['signal']}" if preempted.get("signal") else ""
    return (
        f"preempted{how} at step {preempted.get('step')}: saved {preempted.get('checkpoint')}. "
        f"Exiting with {PREEMPTED_EXIT}; run the same command again to resume."
    )


GLOO_MISMATCH = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")
"""gloo's own check of a collective's sizes (it then aborts the rank)."""

CGROUP = Path("/sys/fs/cgroup")


def oom_kills(root: Path = CGROUP, membership: Path = Path("/proc/self/cgroup")) -> int | None:
    """How many processes the kernel's out-of-memory killer has killed in this process's memory
    cgroup (v2 ``memory.events``, v1 ``memory.oom_control``), or None where that is not readable.

    Read before a launch and after a rank died of SIGKILL: a count that grew names the killer."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2, the unified hierarchy
            candidates += [root / path.lstrip("/") / "memory.events", root / "memory.events"]
        elif "memory" in controllers.split(","):
            base = root / "memory"
            candidates += [
                base / path.lstrip("/") / "memory.oom_control",
                base / "memory.oom_control",
            ]
    for file in candidates:
        try:
            text = file.read_text()
        except OSError:
            continue
        for entry in text.splitlines():
            key, _, value = entry.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


_CALL_EVERYWHERE = ". Call every collective on every rank, in the same order."


def _named_cause(
    output: str,
    run_dir: Path | None,
    failed: RankExit | None,
    raised: tuple[str, str] | None,
    oom_kills_before: int | None,
) -> tuple[str, str] | None:
    """(summary, what to do) for a failure paratrain can name beyond the rank's own error: the
    out-of-memory report a rank left, the kernel's OOM killer, a rank that left early while its
    peers still ran collectives, gloo's abort on a size mismatch; None otherwise."""
    told = _oom_report(run_dir, failed.rank) if failed is not None else None
    if told is not None:
        return told.rstrip("."), _OOM_AGAIN
    killed = oom_kills() if oom_kills_before is not None else None
    if (
        failed is not None
        and failed.signal == signal.SIGKILL
        and killed is not None
        and oom_kills_before is not None
        and killed > oom_kills_before
    ):
        return (
            f"{failed.describe()}: the kernel's out-of-memory killer (its cgroup's oom_kill count "
            f"went from {oom_kills_before} to {killed}), not a crash of the script"
        ), _OOM_AGAIN
    listed = _failures(output)
    # Every rank that failed only lost its peer: the one that left did not fail, it finished.
    if failed is not None and listed and all(_only_lost_its_peer(output, e.rank) for e in listed):
        at = f" at {raised[1]}" if raised is not None else ""
        return (
            f"rank {failed.rank} lost its peer in a collective{at}, and no rank failed on its own: "
            "another rank had left the training loop (it finished, exit 0) while this one still "
            "ran collectives. The ranks ran different numbers of steps or collectives: an early "
            "stop decided on one rank's own metric (decide on run.reduce(metric)), batches of "
            "your own that differ in number (use run.loader), or a save, barrier or collective "
            "on one rank only"
        ), _CALL_EVERYWHERE
    mismatch = GLOO_MISMATCH.search(output)
    if mismatch is not None:
        who = failed.describe() if failed is not None else "a rank aborted"
        return (
            f"{who}: gloo received {mismatch.group(1)} bytes where its collective expected "
            f"{mismatch.group(2)}: the ranks called different collectives (one under `if rank == "
            "0`, after an early exit, or in another order) or passed tensors of different sizes"
        ), _CALL_EVERYWHERE
    return None


_OOM_AGAIN = (
    ". A restart would run out of memory again: lower the memory each rank needs (the changes "
    "above; `paratrain plan` measures each strategy before launch)."
)


def _oom_report(run_dir: Path | None, rank: int) -> str | None:
    """The paragraph a rank that ran out of memory left (``run_dir/oom/rank<r>.txt``)."""
    if run_dir is None:
        return None
    try:
        return (RunDir(run_dir).oom / f"rank{rank}.txt").read_text(encoding="utf-8").strip()
    except OSError:
        return None


def _short(exception_line: str, limit: int = 200) -> str:
    """``paratrain.errors.CheckpointError: text`` as ``CheckpointError: text``, cut at ``limit``."""
    kind, colon, text = exception_line.partition(":")
    line = kind.rsplit(".", 1)[-1] + colon + text
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def _library_folders() -> tuple[str, ...]:
    """Folders whose frames are not the script's: the standard library, installed packages,
    paratrain itself."""
    paths = sysconfig.get_paths()
    here = str(Path(__file__).resolve().parents[2])  # src/paratrain
    found = {paths["stdlib"], paths["purelib"], paths["platlib"], here}
    return (*found, "/site-packages/", "/dist-packages/")


def failure_message(
    code: int,
    output: str,
    run_dir: Path | None,
    max_restarts: int,
    *,
    node_rank: int = 0,
    tracebacks: dict[int, list[str]] | None = None,
    unprefixed: list[str] | None = None,
    oom_kills_before: int | None = None,
) -> str:
    """Why the job failed: the rank and what it raised (or its signal, or the stalled rank),
    where to look, and what to do."""
    failed = root_failure(output)
    summary = failed.describe() if failed else f"torchrun exited with code {code}"
    raised = None
    if failed is not None and tracebacks and failed.rank in tracebacks:
        raised = raised_at(tracebacks[failed.rank], skip=_library_folders())
    elif failed is not None and unprefixed:  # a rank without a process group (yet)
        raised = raised_at(unprefixed, skip=_library_folders())
    if raised is not None:
        summary = f"rank {failed.rank} raised {_short(raised[0])} at {raised[1]}"  # type: ignore[union-attr]
    named = _named_cause(output, run_dir, failed, raised, oom_kills_before)
    if named is not None:
        summary = named[0]
    stacks = RunDir(run_dir).stacks if run_dir is not None else None
    stalls = diagnose(stacks) if stacks is not None and named is None else None
    if stalls is not None:
        summary = f"stalled: {stalls['summary']}; stacks of every rank in {stacks}"
    text = f"the job failed: {summary}"
    if max_restarts:
        done = _restarts_recorded(run_dir)
        text += (
            f", after {done} of {max_restarts} allowed restart(s)"
            if done is not None
            else f" ({max_restarts} restart(s) allowed; the run dir is unknown, so how many ran "
            "is not known)"
        )
    text += ". Its traceback is above" if raised else ". The rank's own output is above"
    if run_dir is not None:
        text += f"; per-rank stacks, stats and restarts are in {run_dir}"
    elif node_rank == 0:
        text += (
            "; the script reported no run dir (it ended before creating paratrain.Run), so "
            "there are no stacks to show"
        )
    else:  # the main process (rank 0), which reports the run dir, runs on node 0
        text += "; node 0's paratrain run names the run dir (or pass --run-dir on every node)"
    if named is not None:
        return text + named[1]
    if stalls is not None:
        return text + (
            ". A stall from outside (a network or storage hiccup) can be restarted: "
            "--max-restarts K resumes from the newest checkpoint; a stall in the code (a "
            "collective on some ranks only) needs the fix its stacks point at."
        )
    if failed is not None and failed.signal is not None:
        return text + (
            ". A rank killed from outside (out of memory, preemption, a lost node) can be "
            "restarted: --max-restarts K resumes from the newest checkpoint."
        )
    if raised is not None:
        return text + ". Fix the error and run again; a restart would raise it again."
    return text + "."
