"""TensorBoard: ``run.log`` scalars as event files in ``run_dir/tensorboard``, the
hyper-parameters in its HParams tab.

    tracker = TensorBoardTracker(options)
    tracker.start(None, None, hparams, warn)      # {"log_dir": "runs/exp/tensorboard"}
    tracker.log({"loss": 0.3}, 10)
    tracker.close()

A resumed run writes into the same folder with ``purge_step`` one past the checkpoint's step:
TensorBoard then hides what the crashed run logged after the checkpoint, so each step shows the
values of the run that went on from it. A restart with no checkpoint (``saved_step`` -1) hides all
that the failed attempt logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from paratrain.errors import EnvironmentMismatchError
from paratrain.trackers.protocol import TrackerOptions, Warn, flat_params


class TensorBoardTracker:
    """A ``torch.utils.tensorboard.SummaryWriter`` on the run dir's ``tensorboard`` folder."""

    name = "tensorboard"

    def __init__(self, options: TrackerOptions) -> None:
        self.log_dir = options.layout.tensorboard
        self._writer: Any = None

    def start(
        self,
        saved: Mapping[str, Any] | None,
        saved_step: int | None,
        hparams: Mapping[str, Any],
        warn: Warn,
    ) -> dict[str, Any]:
        """Open a writer; a resumed run purges the steps after the checkpoint's."""
        try:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams as hparams_summaries
        except ImportError as err:
            raise EnvironmentMismatchError(
                f"TensorBoard logging cannot start: {err}. Run `pip install "
                "'paratrain[tensorboard]'`, or leave 'tensorboard' out of log_to (and "
                "tensorboard=False)."
            ) from err
        purge = saved_step + 1 if saved is not None and saved_step is not None else None
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge)
        if saved is None or purge == 0:  # new, or continued with nothing of the old kept
            # Into this run's own folder: SummaryWriter.add_hparams would make a sub-folder run.
            summaries = hparams_summaries(flat_params(hparams), {})  # type: ignore[no-untyped-call]
            for summary in summaries:
                self._writer.file_writer.add_summary(summary)
            self._writer.flush()
        return {"log_dir": str(self.log_dir)}

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """One scalar per key at ``step``."""
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
