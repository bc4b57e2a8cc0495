"""The environment variables paratrain reads, read in one place.

    env = LaunchEnv.read()                    # os.environ by default
    env.run_dir, env.backend, env.restart_count, env.report

What a launcher passes to the script's :class:`paratrain.Run`:

=========================  ==============================================================
``PARATRAIN_RUN_DIR``      ``paratrain run --run-dir DIR``: the run dir. A script that passes
                           a *different* ``run_dir=`` gets an error naming both, never a
                           silent choice of one.
``PARATRAIN_BACKEND``      ``paratrain run --backend``: the collective backend.
``PARATRAIN_REPORT``       a file the main process writes the resolved run dir into (JSON),
                           so ``paratrain run`` can point at stacks and checkpoints of a
                           script that chose its own run dir.
``PARATRAIN_PREVIOUS_RUN`` ``paratrain run --resume`` / ``--fresh``: ``resume`` or ``fresh``,
                           the ``previous_run`` setting of every rank (it wins over the
                           script's).
``TORCHELASTIC_*``         torchrun: the restart attempt and the job id (``--rdzv-id``).
``SLURM_JOB_ID``           the job id when torchrun has none.
=========================  ==============================================================

What ``paratrain verify-resume`` passes (for testing restart safety; see
``docs/concepts/verify-resume.md`` and :mod:`paratrain.core.faults`):

=========================  ==============================================================
``PARATRAIN_TRACE``        a folder: each rank appends its loop events to ``rank<r>.jsonl``
                           there, one JSON object a line: ``{"event", "n", "step", "epoch",
                           "rank", "restart"}`` (kinds: :data:`paratrain.core.faults.EVENTS`).
``PARATRAIN_KILL``         ``EVENT:N:RANK``: on the first attempt only
                           (``TORCHELASTIC_RESTART_COUNT`` 0), rank RANK SIGKILLs itself at
                           its N-th event of kind EVENT (N counted from 1).
``PARATRAIN_FINAL_STATE``  a folder: when the run closes, or at interpreter exit if it never
                           does, each rank writes its own state there as ``rank<r>.pt``
                           (:mod:`paratrain.runtime.final_state`).
=========================  ==============================================================
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from paratrain.core.faults import KillPoint
from paratrain.errors import ConfigError

DEFAULT_RUN_DIR = "runs/paratrain"
RUN_DIR_VAR = "PARATRAIN_RUN_DIR"
BACKEND_VAR = "PARATRAIN_BACKEND"
REPORT_VAR = "PARATRAIN_REPORT"
PREVIOUS_RUN_VAR = "PARATRAIN_PREVIOUS_RUN"
TRACE_VAR = "PARATRAIN_TRACE"
KILL_VAR = "PARATRAIN_KILL"
FINAL_STATE_VAR = "PARATRAIN_FINAL_STATE"


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchEnv:
    """What the launcher (``paratrain run``, torchrun, Slurm) told this process."""

    run_dir: str | None
    """``PARATRAIN_RUN_DIR`` (None when the launcher did not choose one)."""
    backend: str | None
    """``PARATRAIN_BACKEND``."""
    report: str | None
    """``PARATRAIN_REPORT``: where the main process records the resolved run dir."""
    restart_count: int
    """``TORCHELASTIC_RESTART_COUNT``: 0 on the first start, k after the k-th restart."""
    job_id: str | None
    """An id shared by every attempt of this job (torchrun's ``--rdzv-id``, else Slurm's job
    id); None when neither gives one (:mod:`paratrain.distributed.job_id` then generates it)."""
    trace: str | None = None
    """``PARATRAIN_TRACE``: the folder each rank appends its loop events to."""
    kill: KillPoint | None = None
    """``PARATRAIN_KILL``: the event at which one rank SIGKILLs itself (first attempt only)."""
    final_state: str | None = None
    """``PARATRAIN_FINAL_STATE``: the folder each rank writes its final state to."""
    previous_run: str | None = None
    """``PARATRAIN_PREVIOUS_RUN``: ``resume`` or ``fresh`` from ``paratrain run --resume`` /
    ``--fresh``; None: the script's ``previous_run`` setting holds."""

    @classmethod
    def read(cls, env: Mapping[str, str] | None = None) -> LaunchEnv:
        """Read the variables from ``env`` (default ``os.environ``)."""
        env = os.environ if env is None else env
        raw = env.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
        try:
            restarts = int(raw)
        except ValueError:
            raise ConfigError(
                f"TORCHELASTIC_RESTART_COUNT={raw!r} is not a whole number. Unset it; torchrun "
                "sets it for its workers."
            ) from None
        # torchrun's default --rdzv-id is "none": no id of the job's own, so Slurm's, if any.
        rdzv = env.get("TORCHELASTIC_RUN_ID")
        job = rdzv if rdzv not in (None, "", "none") else env.get("SLURM_JOB_ID")
        return cls(
            run_dir=env.get(RUN_DIR_VAR) or None,
            backend=env.get(BACKEND_VAR) or None,
            report=env.get(REPORT_VAR) or None,
            restart_count=restarts,
            job_id=None if job in (None, "", "none") else job,
            trace=env.get(TRACE_VAR) or None,
            kill=KillPoint.parse(env[KILL_VAR], KILL_VAR) if env.get(KILL_VAR) else None,
            final_state=env.get(FINAL_STATE_VAR) or None,
            previous_run=_previous_run(env.get(PREVIOUS_RUN_VAR) or None),
        )

    def resolve_run_dir(self, passed: str | Path | None) -> Path:
        """The run dir: the script's ``run_dir=``, the launcher's, or the default.

        Both set and different is an error: one of them would be ignored silently.
        """
        launcher = self.run_dir
        if passed is not None and launcher is not None and not _same(passed, launcher):
            raise ConfigError(
                f"The script passes run_dir={str(passed)!r} but the launcher set "
                f"--run-dir {launcher!r} ({RUN_DIR_VAR}). One would be ignored. Drop "
                "run_dir= from the script (the launcher's wins), or launch with the same "
                "--run-dir, or without --run-dir."
            )
        if passed is not None:
            return Path(passed)
        return Path(self.run_dir or DEFAULT_RUN_DIR)

    def write_report(self, record: Mapping[str, object]) -> None:
        """Main process: tell the launcher what was resolved (no-op without a launcher)."""
        if self.report is None:
            return
        path = Path(self.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(dict(record)))
        os.replace(tmp, path)


def _same(a: str | Path, b: str | Path) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def read_report(path: Path) -> dict[str, object] | None:
    """What :meth:`LaunchEnv.write_report` wrote, or None (not written, unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _previous_run(value: str | None) -> str | None:
    if value not in (None, "resume", "fresh"):
        raise ConfigError(
            f"{PREVIOUS_RUN_VAR}={value!r} is not resume or fresh. Unset it; `paratrain run "
            "--resume` or `--fresh` sets it."
        )
    return value
