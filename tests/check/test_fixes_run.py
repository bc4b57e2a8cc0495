"""``paratrain check --fix`` is safe: every rewrite is applied to a real training script, and
the fixed script is run in one process and at 2 gloo ranks (torchrun) next to the original.
Where the original runs, the fixed one trains to the same weights and its checkpoint loads with
the script's own load code; where the original cannot run (PT004 at 2 ranks: DataLoader refuses
shuffle with a sampler), the fixed one does, and its one-process run is unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paratrain.commands.cli import main as cli

pytestmark = [pytest.mark.dist, pytest.mark.e2e]

HEAD = """
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main(out):
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)
"""
"""What both scripts start with: one process, or a gloo rank under torchrun."""

# A finding of every rule --fix rewrites but PT004, whose original cannot run at 2 ranks:
# SAMPLED below has that one.
EVERY_FIX = (
    HEAD
    + """\
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model.to("cpu")
    bias = torch.zeros(1)
    bias.to(torch.float64)  # PT002: the result was meant to be kept
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler(enabled=False)  # PT012
    ds = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(1)),
                       torch.randn(64, 1, generator=torch.Generator().manual_seed(2)))
    sampler = DistributedSampler(ds, shuffle=True, seed=3) if distributed else None
    loader = DataLoader(ds, batch_size=8, sampler=sampler,
                        generator=torch.Generator().manual_seed(4))
    for epoch in range(2):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            with torch.cuda.amp.autocast(enabled=False):  # PT012
                loss = (model(x) + bias.to(x.dtype) - y).pow(2).mean()
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    if rank == 0:
        torch.save({"model": model.state_dict(), "epoch": 2}, out + ".pt")
    if distributed:
        dist.barrier()
    state = torch.load(out + ".pt", map_location="cpu")  # PT008
    model.load_state_dict(state["model"])
    weights = [round(float(v), 6) for p in model.parameters() for v in p.flatten()]
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"weights": weights, "bias_dtype": str(bias.dtype)}, f)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
"""
)

SAMPLED = (
    HEAD
    + """\
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(1)),
                       torch.randn(64, 1, generator=torch.Generator().manual_seed(2)))
    sampler = DistributedSampler(ds, shuffle=True, seed=3) if distributed else None
    loader = DataLoader(ds, batch_size=8, shuffle=True, sampler=sampler,  # PT004
                        generator=torch.Generator().manual_seed(4))
    order = []
    for x, y in loader:
        order.append(round(float(x[0, 0]), 6))
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    weights = [round(float(v), 6) for v in model.weight.flatten()]
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"order": order, "weights": weights}, f)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
"""
)


def _fixed(tmp: Path, name: str, text: str, rules: set[str]) -> tuple[Path, Path]:
    original = tmp / f"{name}.py"
    original.write_text(textwrap.dedent(text))
    fixed = tmp / f"{name}_fixed.py"
    fixed.write_text(original.read_text())
    assert cli(["check", str(fixed), "--fix"]) in (0, 1)
    changed = fixed.read_text()
    assert changed != original.read_text()
    left = {line.split()[1] for line in _findings(fixed)}
    assert not (left & rules), left  # every finding of these rules was rewritten
    return original, fixed


def _findings(script: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "paratrain", "check", str(script)], capture_output=True, text=True
    )
    return [ln.split(": ", 1)[1] for ln in done.stdout.splitlines() if ": PT0" in ln]


def _run(script: Path, out: Path, ranks: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("RANK", None)
    if ranks == 1:
        argv = [sys.executable, str(script), str(out)]
    else:
        argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={ranks}", str(script), str(out),
        ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def _results(out: Path, ranks: int) -> list[dict[str, object]]:
    return [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(ranks)]


def test_every_rewrite_keeps_the_training_and_the_checkpoint_loads(tmp_path: Path) -> None:
    original, fixed = _fixed(tmp_path, "every_fix", EVERY_FIX, {"PT002", "PT008", "PT012"})
    text = fixed.read_text()
    assert "bias = bias.to(torch.float64)" in text and "weights_only=True" in text
    assert 'torch.amp.GradScaler("cuda", enabled=False)' in text
    for ranks in (1, 2):
        before, after = tmp_path / f"before{ranks}", tmp_path / f"after{ranks}"
        ran = _run(original, before, ranks)
        assert ran.returncode == 0, ran.stderr[-2000:]
        ran = _run(fixed, after, ranks)
        assert ran.returncode == 0, ran.stderr[-2000:]  # its own load reads the checkpoint
        old, new = _results(before, ranks), _results(after, ranks)
        # PT002's rewrite is the point of the fix: the tensor now has the dtype asked for.
        assert [o["bias_dtype"] for o in old] == ["torch.float32"] * ranks
        assert [n["bias_dtype"] for n in new] == ["torch.float64"] * ranks
        assert [o["weights"] for o in old] == [n["weights"] for n in new]


def test_the_shuffle_rewrite_keeps_one_process_and_lets_the_ranks_run(tmp_path: Path) -> None:
    original, fixed = _fixed(tmp_path, "sampled", SAMPLED, {"PT004"})
    assert "shuffle=sampler is None, sampler=sampler" in fixed.read_text()
    ran = _run(original, tmp_path / "before1", 1)
    assert ran.returncode == 0, ran.stderr[-2000:]
    ran = _run(fixed, tmp_path / "after1", 1)
    assert ran.returncode == 0, ran.stderr[-2000:]
    # One process, no sampler: the same shuffled order and weights as before the fix.
    assert _results(tmp_path / "before1", 1) == _results(tmp_path / "after1", 1)
    refused = _run(original, tmp_path / "before2", 2)
    assert refused.returncode != 0 and "mutually exclusive with shuffle" in refused.stderr
    ran = _run(fixed, tmp_path / "after2", 2)
    assert ran.returncode == 0, ran.stderr[-2000:]
    orders = [r["order"] for r in _results(tmp_path / "after2", 2)]
    assert len(orders[0]) == len(orders[1]) == 4 and not set(orders[0]) & set(orders[1])
