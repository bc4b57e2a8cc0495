"""The job id: the launcher's, else generated once per job and read back by its restarts."""

from __future__ import annotations

from pathlib import Path

from paratrain.distributed.environment import LaunchEnv
from paratrain.distributed.job_id import job_id


def _env(**values: str) -> LaunchEnv:
    return LaunchEnv.read(values)


def test_the_launchers_id_comes_first(tmp_path: Path) -> None:
    record = tmp_path / "job.json"
    assert job_id(_env(TORCHELASTIC_RUN_ID="mine", SLURM_JOB_ID="7"), record) == "mine"
    assert job_id(_env(TORCHELASTIC_RUN_ID="none", SLURM_JOB_ID="7"), record) == "7"
    assert not record.exists()


def test_a_generated_id_is_reused_by_restarts_and_not_by_the_next_job(tmp_path: Path) -> None:
    record = tmp_path / "run" / "job.json"
    first = job_id(_env(TORCHELASTIC_RUN_ID="none"), record)
    assert first.startswith("job-") and record.exists()
    restarted = _env(TORCHELASTIC_RUN_ID="none", TORCHELASTIC_RESTART_COUNT="2")
    assert job_id(restarted, record) == first
    assert job_id(_env(), record) != first  # a new job in the same run dir
    record.write_text("{not json")
    assert job_id(restarted, record).startswith("job-")  # unreadable: a new one, no crash
