"""``examples/notebook.ipynb`` executes top to bottom in a real Jupyter kernel (2 ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from tests.examples.support import EXAMPLES

pytestmark = pytest.mark.examples


def test_the_notebook_trains_on_two_ranks_and_its_weights_reload(tmp_path: Path) -> None:
    notebook = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    ).execute()  # raises CellExecutionError with the cell's traceback if any cell fails
    text = "\n".join(
        output.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    )
    assert "2 ranks, final test accuracy" in text
    assert text.count("epoch 0: loss") == 1  # the main process prints, once
    assert "reloaded: test accuracy" in text
    plots = [
        o for c in notebook.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    assert len(plots) == 1
    run_dir = tmp_path / "runs" / "notebook"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and rows[-1]["loss"] < rows[0]["loss"]
    weights = torch.load(run_dir / "model.pt", weights_only=True)
    assert sorted(weights) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert len(list((run_dir / "checkpoints").iterdir())) == 1
