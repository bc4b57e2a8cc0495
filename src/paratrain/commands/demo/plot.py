"""Plot the demo's loss and accuracy curves into a PNG.

    records = read_records(files.metrics, files.restarts)
    plot_curves(records, files.curves, job=CurvesJob("ddp", 2, 0.95))

:func:`curves_figure` builds the figure without writing it (what the tests look at).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paratrain.commands.demo.records import TrainingRecords
from paratrain.errors import EnvironmentMismatchError


@dataclass(frozen=True, slots=True)
class CurvesJob:
    """What the figure says about the job that made the curves."""

    strategy: str
    """The strategy the ranks ran (``ddp``, ``fsdp``, ...)."""
    world_size: int
    """How many ranks trained."""
    target: float
    """The test accuracy the demo aims for (drawn as a labelled line)."""
    resumed_after: int | None = None
    """The epoch whose checkpoint a restart resumed from (marked), or None."""


def curves_figure(records: TrainingRecords, job: CurvesJob) -> Any:
    """A two-panel ``matplotlib.figure.Figure``: training loss and test accuracy per epoch."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:
        raise EnvironmentMismatchError(
            "Plotting needs matplotlib. Run `pip install 'paratrain[demo]'`."
        ) from err
    epochs = [r.epoch for r in records.epochs]
    fig = Figure(figsize=(9, 3.8), constrained_layout=True)
    ax_loss, ax_acc = fig.subplots(1, 2)
    ax_loss.plot(epochs, [r.loss for r in records.epochs], marker="o", label="train loss")
    ax_loss.set(xlabel="epoch", ylabel="train loss (mean over ranks)", yscale="log")
    ax_acc.plot(
        epochs,
        [r.accuracy for r in records.epochs],
        marker="o",
        color="tab:green",
        label="test accuracy",
    )
    ax_acc.axhline(
        job.target,
        color="grey",
        linestyle="--",
        linewidth=1,
        label=f"target {job.target * 100:g} %",
    )
    ax_acc.set(xlabel="epoch", ylabel="test accuracy (each sample once)", ylim=(0, 1.02))
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if job.resumed_after is not None:
            ax.axvline(
                job.resumed_after + 0.5,
                color="tab:red",
                linestyle=":",
                linewidth=1,
                label=f"crash in epoch {job.resumed_after + 1}, resumed from its start",
            )
    ax_loss.legend(loc="upper right", fontsize="small")
    ax_acc.legend(loc="lower right", fontsize="small")
    ranks = f"{job.world_size} rank{'s' if job.world_size != 1 else ''}"
    fig.suptitle(f"paratrain demo: DigitsCNN on scikit-learn digits, {job.strategy} on {ranks}")
    return fig


def plot_curves(records: TrainingRecords, out: Path, *, job: CurvesJob) -> Path:
    """Write :func:`curves_figure` to ``out`` as a PNG."""
    curves_figure(records, job).savefig(out, dpi=110)
    return out
