"""The job's id: one per job, the same in every attempt of it (a torchrun restart).

    job = job_id(LaunchEnv.read(), RunDir("runs/exp").job)    # main process; broadcast it

Checkpoints carry it as their run id and lineage, so ``keep_last`` never rotates another job's
checkpoints in a shared directory; trackers use it to continue their runs after a restart that
came before the first save. It comes from, first found:

1. the launcher: torchrun's ``--rdzv-id`` (``TORCHELASTIC_RUN_ID``; ``--standalone`` makes a
   fresh one per torchrun), else Slurm's ``SLURM_JOB_ID``;
2. after a torchrun restart (``TORCHELASTIC_RESTART_COUNT`` > 0): the id the first attempt
   recorded in the run dir (``run_dir/job.json``);
3. a new ``job-<12 hex digits>``, recorded there for the restarts of this job.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from paratrain.distributed.environment import LaunchEnv

__all__ = ["job_id"]


def job_id(env: LaunchEnv, record: Path) -> str:
    """This job's id (main process only: it reads and writes ``record``)."""
    if env.job_id:
        return env.job_id
    if env.restart_count > 0:
        recorded = _recorded(record)
        if recorded:
            return recorded
    new = f"job-{uuid.uuid4().hex[:12]}"
    record.parent.mkdir(parents=True, exist_ok=True)
    tmp = record.with_name(f".{record.name}.tmp")
    tmp.write_text(json.dumps({"id": new}) + "\n")
    os.replace(tmp, record)
    return new


def _recorded(record: Path) -> str | None:
    try:
        value = json.loads(record.read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None
