"""Where a run writes: every artefact of a run dir is named here, once.

    layout = RunDir("runs/exp")
    layout.checkpoints      # runs/exp/checkpoints   (run.save / run.resume; ckpt_dir overrides)
    layout.ckpt_staging     # runs/exp/.ckpt-staging/<host>/   (local copies for a URL ckpt_dir)
    layout.stats            # runs/exp/stats/rank<r>.jsonl   (per-rank throughput, memory)
    layout.stacks           # runs/exp/stacks/rank<r>.{txt,json}   (hang diagnosis)
    layout.metrics          # runs/exp/metrics.jsonl   (run.log)
    layout.restarts         # runs/exp/restarts.jsonl  (one line per torchrun restart)
    layout.tensorboard      # runs/exp/tensorboard/
    layout.mlruns           # runs/exp/mlruns/   (MLflow's store when no tracking URI is set)
    layout.wandb            # runs/exp/wandb/    (wandb's run folders, offline-run-* offline)
    layout.profile          # runs/exp/profile/rank<r>.steps-<a>-<b>.{pt.trace,summary}.json
    layout.report           # runs/exp/run.json   (what the script's Run resolved)
    layout.job              # runs/exp/job.json   (a generated job id, for its restarts)
    layout.tracker_runs     # runs/exp/tracker-runs.json   (the job's tracker runs)

Only the main process writes the shared files (metrics, restarts, report); every rank writes its
own file under ``stats/``, ``stacks/`` and ``profile/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from paratrain.core.paths import is_url


@dataclass(frozen=True, slots=True)
class RunDir:
    """The layout of one run dir."""

    root: Path
    """The run dir itself."""

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def checkpoints(self) -> Path:
        """Default checkpoint directory (``ckpt_dir`` overrides it)."""
        return self.root / "checkpoints"

    def checkpoints_at(self, ckpt_dir: str | Path | None) -> str | Path:
        """Where this run's checkpoints go: ``ckpt_dir`` (a folder or a URL), else
        :attr:`checkpoints`. The one place that rule is written."""
        if not ckpt_dir:
            return self.checkpoints
        return ckpt_dir if is_url(ckpt_dir) else Path(ckpt_dir)

    @property
    def ckpt_staging(self) -> Path:
        """Local copies of checkpoints when ``ckpt_dir`` is a URL (a folder per machine inside:
        the save being written, the newest uploaded or downloaded one)."""
        return self.root / ".ckpt-staging"

    @property
    def stats(self) -> Path:
        """Per-rank stats JSON lines, ``rank<r>.jsonl``."""
        return self.root / "stats"

    @property
    def stacks(self) -> Path:
        """Hang diagnosis: per-rank stacks and verdicts, NCCL flight-recorder dumps."""
        return self.root / "stacks"

    @property
    def oom(self) -> Path:
        """Out-of-memory reports: ``rank<r>.txt``, the paragraph a rank left when it ran out."""
        return self.root / "oom"

    @property
    def metrics(self) -> Path:
        """Scalars from ``run.log``, one JSON object per line."""
        return self.root / "metrics.jsonl"

    @property
    def restarts(self) -> Path:
        """One JSON line per torchrun restart (time, attempt, step, epoch, resumed)."""
        return self.root / "restarts.jsonl"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard event files."""
        return self.root / "tensorboard"

    @property
    def mlruns(self) -> Path:
        """MLflow's file store, when ``log_to`` has mlflow and no tracking URI is set."""
        return self.root / "mlruns"

    @property
    def wandb(self) -> Path:
        """wandb's run folders (``run-*``, or ``offline-run-*`` with WANDB_MODE=offline)."""
        return self.root / "wandb"

    @property
    def profile(self) -> Path:
        """Traces and summaries of profiled steps (``Run(profile=...)``, ``run.profile()``)."""
        return self.root / "profile"

    @property
    def report(self) -> Path:
        """``run.json``: the settings the script's Run resolved (run dir, checkpoint dir, ranks)."""
        return self.root / "run.json"

    @property
    def job(self) -> Path:
        """``job.json``: the job id a job without a launcher id generated, read back by its
        restarts (:mod:`paratrain.distributed.job_id`)."""
        return self.root / "job.json"

    @property
    def tracker_runs(self) -> Path:
        """``tracker-runs.json``: the job id and its tracker runs, continued by a restart that
        has no checkpoint to take them from."""
        return self.root / "tracker-runs.json"
