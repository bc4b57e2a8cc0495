"""``paratrain ckpt`` prints for people (yes/no, lists as words, sizes), never a Python repr;
``--json`` stays data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import paratrain as pt
from paratrain.commands.ckpt.command import human
from paratrain.commands.cli import main

REPR = re.compile(r"\bTrue\b|\bFalse\b|\bNone\b|\[\]|\{\}|\['|\{'|=\w+, ")


@pytest.fixture
def checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    with pt.Run(ckpt_dir=tmp_path, progress=False, stats_every=None) as run:
        net = torch.nn.Linear(4, 2)
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        folders = []
        for _ in range(2):
            run.backward(model(torch.ones(3, 4)).sum())
            run.step(opt)
            folders.append(run.save())
    first, second = folders
    assert first is not None and second is not None
    return first, second


def test_inspect_verify_and_diff_print_words(
    checkpoints: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = checkpoints
    assert main(["ckpt", "inspect", str(second)]) == 0
    assert main(["ckpt", "verify", str(second)]) == 0
    assert main(["ckpt", "diff", str(first), str(second)]) == 1
    out = capsys.readouterr().out
    assert not REPR.search(out), REPR.search(out)
    assert "optimizer: yes" in out and "identical: no" in out
    assert "first keys:\n  - bias\n  - weight\n" in out  # a list: one bullet line per item
    assert "\n  bias: " in out  # tensor names are shown as they are, not as words


def test_a_folder_of_checkpoints_lists_each_with_its_problems(
    checkpoints: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = checkpoints
    (second / "optimizer.safetensors").unlink()
    assert main(["ckpt", "inspect", str(first.parent)]) == 0
    out = capsys.readouterr().out
    assert not REPR.search(out), REPR.search(out)
    assert (
        f"checkpoints:\n  - path: {second}\n    valid: no\n    problems:\n"
        "      - optimizer.safetensors is missing\n"
        f"  - path: {first}\n    valid: yes\n    problems: none\n"
    ) in out


def test_json_stays_data(
    checkpoints: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ckpt", "inspect", "--json", str(checkpoints[1])]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["resume_state"]["optimizer"] is True and data["wrapper_prefixes"] == {}


def test_values_of_every_kind_read_as_words() -> None:
    lines = human(
        {
            "valid": True,
            "problems": [],
            "bytes": 3 * 2**20,
            "parameters": 527362,
            "first_keys": ["a.weight", "a.bias"],
            "files": [{"name": "a", "ok": False}, {"name": "b", "ok": True}],
            "max_abs_diff": {"layer_norm.weight": 0.5},
            "note": None,
        }
    )
    assert lines == [
        "valid: yes",
        "problems: none",
        "size: 3.0 MiB (3,145,728 bytes)",
        "parameters: 527,362",
        "first keys:",
        "  - a.weight",
        "  - a.bias",
        "files:",
        "  - name: a",
        "    ok: no",
        "  - name: b",
        "    ok: yes",
        "max abs diff:",
        "  layer_norm.weight: 0.5",
        "note: none",
    ]
