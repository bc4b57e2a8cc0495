"""Weights & Biases: ``run.log`` scalars against a ``step`` axis, the hyper-parameters as the run's
config, one wandb run per paratrain run (resumes included).

    tracker = WandbTracker(options)        # project: tracker_project; files under run_dir/wandb
    tracker.start(None, None, hparams, warn)    # {"id": "1x2y3z4w", "project": "paratrain"}
    tracker.log({"loss": 0.3}, 10)
    tracker.close()                        # wandb.finish

``WANDB_MODE=offline`` (no account, no network) writes ``run_dir/wandb/offline-run-*``; upload
later with ``wandb sync``. A resumed run calls ``wandb.init(id=<saved id>, resume="allow")`` and
does not send the config again. Every chart's x-axis is paratrain's ``step`` (a metric of its
own), not wandb's internal counter, which refuses steps below the highest it has seen: so the
steps a crashed run logged after the checkpoint are logged again rather than dropped.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from paratrain.errors import EnvironmentMismatchError
from paratrain.trackers.protocol import TrackerOptions, Warn

STEP = "step"
"""The x-axis metric every logged value is plotted against."""


class WandbTracker:
    """One wandb run in the ``tracker_project`` project."""

    name = "wandb"

    def __init__(self, options: TrackerOptions) -> None:
        self.project = options.project
        self.run_name = options.run_name
        self.dir = None if os.environ.get("WANDB_DIR") else options.layout.root
        self._run: Any = None

    def start(
        self,
        saved: Mapping[str, Any] | None,
        saved_step: int | None,
        hparams: Mapping[str, Any],
        warn: Warn,
    ) -> dict[str, Any]:
        """``wandb.init`` a fresh run with the config, or the checkpoint's run id."""
        saved_id = saved.get("id") if saved else None
        resumed = isinstance(saved_id, str)
        try:
            import wandb

            if self.dir is not None:
                self.dir.mkdir(parents=True, exist_ok=True)
            self._run = wandb.init(
                project=self.project,
                name=self.run_name,
                dir=self.dir,
                id=saved_id if resumed else None,
                resume="allow" if resumed else None,
                config=None if resumed else dict(hparams),
            )
            self._run.define_metric(STEP)
            self._run.define_metric("*", step_metric=STEP)
        except Exception as err:
            raise EnvironmentMismatchError(
                f"wandb could not start a run ({type(err).__name__}: {err}). Log in (`wandb "
                "login` or WANDB_API_KEY), or set WANDB_MODE=offline to write the run to "
                "run_dir/wandb and `wandb sync` it later; or leave 'wandb' out of log_to."
            ) from err
        return {"id": str(self._run.id), "project": self.project}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """``metrics`` and the step they belong to, as one row."""
        self._run.log({**metrics, STEP: step})

    def close(self) -> None:
        """``finish`` the run (uploads what is left, or closes the offline files)."""
        if self._run is not None:
            self._run.finish()
            self._run = None
