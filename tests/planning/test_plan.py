"""``paratrain plan``: one fake step of the script, each strategy's peak per rank, and errors that
name the line a fake tensor cannot run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from paratrain.commands.cli_types import memory_size

TRAIN = """
import torch, torch.nn as nn, torch.nn.functional as F
import paratrain as pt
data = torch.utils.data.TensorDataset(torch.randn(128, 256), torch.randint(0, 10, (128,)))
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
with pt.Run(seed=0, grad_accum=2) as run:
    model, optimizer = run.setup(model, optimizer)
    for x, y in run.loader(data, batch_size=16):
        with run.accumulate(model):
            loss = F.cross_entropy(model(x), y)
            run.backward(loss)
        run.step(optimizer)
        print(loss.item())  # a fake tensor's item() is 1 in a plan
"""


def _plan(script: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "paratrain", "plan", *flags, str(script)],
        capture_output=True, text=True, cwd=script.parent, timeout=300,
    )  # fmt: skip


def test_a_plan_splits_each_strategys_peak_and_recommends_one(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    done = _plan(script, "--nproc", "4", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    rows = {row["strategy"]: row for row in plan["rows"]}
    assert set(rows) == {"ddp", "fsdp", "fsdp, no reshard"}
    params = 256 * 1024 + 1024 + 1024 * 10 + 10
    assert plan["parameters"] == params
    # DDP holds every parameter and one bucket copy of every gradient; fsdp a quarter of them.
    assert rows["ddp"]["parameters"] == 4 * params
    assert rows["ddp"]["communication"] >= 4 * params
    assert rows["fsdp"]["parameters"] < rows["ddp"]["parameters"]
    assert rows["fsdp"]["total"] < rows["ddp"]["total"]
    for row in rows.values():
        assert row["total"] == sum(row[k] for k in
                                   ("parameters", "gradients", "optimizer", "activations",
                                    "communication"))  # fmt: skip
    assert plan["recommended"] == min(rows.values(), key=lambda r: r["total"])["strategy"]
    assert not list(tmp_path.glob("runs")) and not list(tmp_path.glob("checkpoints"))


def test_one_process_plan_equals_what_the_step_allocates(tmp_path: Path) -> None:
    """The one-process row against the same step run for real, measured by torch's profiler
    (every CPU allocation from the script's first line)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    done = _plan(script, "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)["rows"]
    measure = tmp_path / "measure.py"
    measure.write_text(
        "import json, runpy, sys, tempfile\n"
        "from torch.profiler import ProfilerActivity, profile\n"
        "sys.argv = ['train.py']\n"
        "with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:\n"
        "    runpy.run_path('train.py', run_name='__main__')\n"
        "trace = tempfile.mktemp(suffix='.json')\n"
        "prof.export_chrome_trace(trace)\n"
        "events = json.load(open(trace))['traceEvents']\n"
        "print('PEAK', max(e['args']['Total Allocated'] for e in events "
        "if e.get('name') == '[memory]'))\n"
    )
    real = subprocess.run(
        [sys.executable, str(measure)], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert real.returncode == 0, real.stderr
    peak = int(real.stdout.split("PEAK")[-1])
    assert 0.9 <= row["total"] / peak <= 1.1, (row, peak)


def test_a_value_read_before_the_first_step_is_named_with_its_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN.replace("            run.backward(loss)",
                                    "            print(torch.nonzero(loss.reshape(1)))\n"
                                    "            run.backward(loss)"))  # fmt: skip
    done = _plan(script)
    assert done.returncode == 2
    assert re.search(
        r"train\.py:\d+: print\(torch\.nonzero\(loss\.reshape\(1\)\)\)",
        done.stderr.replace("\n", " "),
    )
    assert "Traceback" not in done.stderr


def test_bad_input_is_one_paragraph(tmp_path: Path) -> None:
    done = _plan(tmp_path / "missing.py")
    assert done.returncode == 2 and "No such script" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "paratrain", "plan", "--gpu-memory", "lots", "x.py"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "not a memory size" in done.stderr


def test_memory_sizes() -> None:
    assert memory_size("80GiB") == 80 * 2**30
    assert memory_size("24GB") == 24 * 10**9
    assert memory_size("512 MiB") == 512 * 2**20
    with pytest.raises(Exception, match="not a memory size"):
        memory_size("80 furlongs")


@pytest.mark.parametrize("shape", ["dcgan", "nanogpt", "torchtitan_train"])
def test_foreign_loop_shapes_plan(shape: str) -> None:
    """A discriminator called twice before its backward (DCGAN), batches sampled by indexing
    with random offsets (nanoGPT), `nn.init.trunc_normal_`'s rejection loop (torchtitan)."""
    script = Path(__file__).parents[1] / "resume_corpus" / f"{shape}.py"
    done = _plan(script, "--nproc", "2", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["rows"]
    names = [row["strategy"] for row in rows]
    assert names[:3] == ["ddp", "fsdp", "fsdp, no reshard"]
    assert names[3:] in ([], ["ddp + AC", "fsdp + AC"])  # with repeated blocks to checkpoint
    assert all(row["total"] > 0 for row in rows)


BLOCKS = """
import sys
import torch, torch.nn as nn, torch.nn.functional as F
import paratrain as pt
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128))
    def forward(self, x):
        return x + self.mlp(x)
model = nn.Sequential(*[Block() for _ in range(4)], nn.Linear(128, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(512, 64, 128), torch.randint(0, 10, (512,)))
settings = {"activation_checkpointing": (Block,)} if sys.argv[1:] == ["ac"] else {}
with pt.Run(seed=0, **settings) as run:
    model, optimizer = run.setup(model, optimizer)
    for x, y in run.loader(data, batch_size=32):
        run.backward(F.cross_entropy(model(x).mean(1), y))
        run.step(optimizer)
"""


def test_recomputed_activations_and_host_offload_are_rows_of_their_own(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(BLOCKS)
    done = _plan(script, "--nproc", "2", "--gpu-memory", "80GiB", "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["strategy"]: row for row in json.loads(done.stdout)["rows"]}
    assert list(rows) == ["ddp", "fsdp", "fsdp, no reshard", "ddp + AC", "fsdp + AC",
                          "fsdp, offload"]  # fmt: skip
    # The four blocks' activations are recomputed: far less is held, the state is unchanged.
    for name in ("ddp", "fsdp"):
        assert rows[f"{name} + AC"]["activations"] < 0.7 * rows[name]["activations"]
        assert rows[f"{name} + AC"]["optimizer"] == rows[name]["optimizer"]
    assert "4 blocks" in rows["ddp + AC"]["why"]
    # With its state in host memory, a rank's device holds no optimizer state and no shard.
    offload, fsdp = rows["fsdp, offload"], rows["fsdp"]
    assert offload["optimizer"] == 0 and fsdp["optimizer"] > 0
    assert offload["parameters"] < fsdp["parameters"]
    assert offload["activations"] == fsdp["activations"]
    assert "host memory" in offload["why"]


def test_a_script_that_checkpoints_already_gets_no_second_ac_row(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(BLOCKS)
    plain = _plan(script, "--nproc", "2", "--json")
    done = subprocess.run(
        [sys.executable, "-m", "paratrain", "plan", "--nproc", "2", "--json", str(script), "ac"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and plain.returncode == 0, done.stderr + plain.stderr
    rows = {row["strategy"]: row for row in json.loads(done.stdout)["rows"]}
    planned = {row["strategy"]: row for row in json.loads(plain.stdout)["rows"]}
    assert list(rows) == ["ddp", "fsdp", "fsdp, no reshard"]
    # The script's own checkpointing is measured: as the plain script's "+ AC" rows predicted.
    assert rows["ddp"]["total"] == pytest.approx(planned["ddp + AC"]["total"], rel=0.1)
