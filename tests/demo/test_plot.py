"""The curves figure: whole-epoch ticks, a labelled target line, the job in the title."""

from __future__ import annotations

from pathlib import Path

import pytest

from paratrain.commands.demo.plot import CurvesJob, curves_figure, plot_curves
from paratrain.commands.demo.records import read_records
from tests.demo.fake_runs import write_run
from tests.support.images import png_size

pytest.importorskip("matplotlib")


def _figure(tmp_path: Path, job: CurvesJob):  # type: ignore[no-untyped-def]
    files = write_run(tmp_path, attempts=[range(1, 29)], epochs=7)
    return curves_figure(read_records(files.metrics, files.restarts), job)


def test_epoch_ticks_are_whole_numbers(tmp_path: Path) -> None:
    fig = _figure(tmp_path, CurvesJob("ddp", 2, 0.95))
    fig.canvas.draw()  # the locator picks the ticks when the figure is drawn
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        assert ax.get_xlabel() == "epoch"


def test_the_target_is_a_labelled_line_and_the_title_names_the_job(tmp_path: Path) -> None:
    fig = _figure(tmp_path, CurvesJob("fsdp", 4, 0.95))
    accuracy = fig.axes[1]
    labels = [t.get_text() for t in accuracy.get_legend().get_texts()]
    assert "target 95 %" in labels
    target = next(line for line in accuracy.get_lines() if line.get_label() == "target 95 %")
    assert list(target.get_ydata()) == [0.95, 0.95]
    title = fig.get_suptitle()
    assert "fsdp" in title and "4 ranks" in title


def test_one_rank_is_singular_and_a_resume_is_marked(tmp_path: Path) -> None:
    fig = _figure(tmp_path, CurvesJob("cpu", 1, 0.9, resumed_after=3))
    assert fig.get_suptitle().endswith("cpu on 1 rank")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "crash in epoch 4, resumed from its start" in labels
    assert "target 90 %" in [t.get_text() for t in fig.axes[1].get_legend().get_texts()]


def test_plot_curves_writes_a_png(tmp_path: Path) -> None:
    files = write_run(tmp_path, attempts=[range(1, 13)], epochs=3)
    out = plot_curves(
        read_records(files.metrics, files.restarts), files.curves, job=CurvesJob("ddp", 2, 0.95)
    )
    width, height = png_size(out)
    assert width > 500 and height > 200
