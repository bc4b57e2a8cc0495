"""``paratrain check --diff`` / ``--fix``: the mechanical rewrites, exactly, and nothing else."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from paratrain.commands.cli import main

SCRIPT = """\ufeffimport torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
model = DDP(torch.nn.Linear(2, 2))
# 训练: a comment in another script, and the columns after it
x = torch.randn(3); x.to("cuda")
ds = torch.utils.data.TensorDataset(torch.randn(4, 2))
sampler = DistributedSampler(ds)
loader = DataLoader(ds, batch_size=2, shuffle=True, sampler=sampler)
scaler = torch.cuda.amp.GradScaler(init_scale=1024)
for epoch in range(2):
    sampler.set_epoch(epoch)
    with torch.cuda.amp.autocast():
        pass
    with torch.cuda.amp.autocast(True):  # positional: means dtype in torch.autocast, not fixed
        pass
if dist.get_rank() == 0:
    torch.save(model.state_dict(), "m.pt")
dist.barrier()
state = torch.load("m.pt", map_location="cpu",)
other = torch.load("m.pt", map_location="cpu")  # paratrain: ignore[PT008]
"""

FIXED = (
    SCRIPT.replace('x.to("cuda")', 'x = x.to("cuda")')
    .replace("shuffle=True, sampler", "shuffle=sampler is None, sampler")
    .replace("torch.cuda.amp.GradScaler(init_scale", 'torch.amp.GradScaler("cuda", init_scale')
    .replace("with torch.cuda.amp.autocast():", 'with torch.autocast("cuda"):')
    .replace('map_location="cpu",)', 'map_location="cpu", weights_only=True)')
)


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["check", str(tmp_path / "train.py"), *args])
    return code, capsys.readouterr().out


def test_diff_shows_the_rewrites_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    code, out = _check(tmp_path, capsys)
    assert code == 1 and out.count(" [*] ") == 5 and "[*] 5 fixable with --fix" in out
    code, out = _check(tmp_path, capsys, "--diff")
    assert code == 1 and script.read_text(encoding="utf-8") == SCRIPT
    added = [ln for ln in out.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert len(added) == 5 and '+    with torch.autocast("cuda"):' in out


def test_fix_rewrites_exactly_the_mechanical_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    code, out = _check(tmp_path, capsys, "--fix")
    assert script.read_bytes() == FIXED.encode("utf-8")  # the byte-order mark kept
    ast.parse(FIXED.removeprefix("\ufeff"))
    assert "Fixed 5 problems in 1 script(s)." in out
    # left: the positional autocast (PT012, no [*]) and the wrapper's save (PT006: its fix
    # must change the script's resume too, so it is a suggestion); the ignored load is silent
    assert code == 1 and "PT012 deprecated" not in out
    assert out.count(": PT0") == 2 and ":18:10: PT012 autocast" in out
    assert "PT006" in out and "change the script's resume together with the save" in out
    code, out = _check(tmp_path, capsys, "--fix")  # nothing more to do
    assert script.read_bytes() == FIXED.encode("utf-8") and "Fixed" not in out


def test_fix_with_json_keeps_stdout_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "train.py").write_text(SCRIPT, encoding="utf-8")
    main(["check", str(tmp_path / "train.py"), "--fix", "--json"])
    captured = capsys.readouterr()
    assert [f["rule"] for f in json.loads(captured.out)] == ["PT012", "PT006"]
    assert "Fixed 5 problems" in captured.err and "+++" in captured.err


def test_clean_scripts_have_no_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(2).to('cpu')\n")
    code, out = _check(tmp_path, capsys, "--diff")
    assert code == 0 and out == ""
