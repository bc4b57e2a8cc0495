"""``paratrain plan``'s predictions against the peak a real run allocates, per rank.

    python benchmarks/plan_accuracy.py               # 2 gloo ranks on CPU, every case (~5 min)
    python benchmarks/plan_accuracy.py --quick       # four cases

For each case (model × precision × grad_accum × strategy) a small script is written, planned with
``paratrain plan --json --nproc 2``, and run for real under ``paratrain run --nproc 2`` with
torch's profiler recording every CPU allocation from the script's first line: the measured peak
is the highest "Total Allocated" (bytes torch allocated, not RSS) over three steps, the larger of
the two ranks, over three runs (a gloo run's peak varies with the collectives still in flight). The
table prints the planned peak ÷ the highest and the lowest measured (target 0.90-1.10).
"""

# ruff: noqa: E501  (the case script is embedded as one string; its table lines are long)
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = r"""
import json, os, sys, tempfile
import torch, torch.nn as nn, torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
import paratrain as pt

kind, strategy, precision, accum = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
checkpointed = sys.argv[5:] == ["ac"]  # the blocks' activations recomputed in backward
out = os.environ.get("PLAN_MEASURE")
prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True) if out else None
if prof is not None:
    prof.start()
torch.manual_seed(0)
if kind == "mlp":
    model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
                            for _ in range(3)], nn.Linear(512, 10))
    data = torch.utils.data.TensorDataset(torch.randn(512, 512), torch.randint(0, 10, (512,)))
    loss_of = lambda out, y: F.cross_entropy(out, y)
    wrap = (nn.Sequential,)
elif kind == "cnn":
    blocks = []
    for cin, cout in ((3, 32), (32, 64), (64, 64)):
        blocks.append(nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()))
    model = nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    data = torch.utils.data.TensorDataset(torch.randn(256, 3, 32, 32), torch.randint(0, 10, (256,)))
    loss_of = lambda out, y: F.cross_entropy(out, y)
    wrap = (nn.Sequential,)
else:  # a GPT-shaped transformer with tied embeddings
    class Block(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False, is_causal=False)[0]
            return x + self.mlp(self.ln2(x))
    class GPT(nn.Module):
        def __init__(self, vocab=2048, d=256, depth=3, seq=64):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(seq, d))
            self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
            self.head.weight = self.tok.weight
        def forward(self, idx):
            x = self.tok(idx) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))
    model = GPT()
    tokens = torch.randint(0, 2048, (256, 65))
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    loss_of = lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten())
    Block.__module__ = "__main__"
    wrap = (Block,)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
settings = dict(strategy=strategy, precision=precision, grad_accum=accum, seed=0, progress=False)
if checkpointed:
    settings["activation_checkpointing"] = wrap
if strategy.startswith("fsdp"):
    settings.update(strategy="fsdp", fsdp_wrap=wrap, fsdp_reshard_after_forward=strategy == "fsdp")
with pt.Run(**settings) as run:
    model, optimizer = run.setup(model, optimizer)
    loader = run.loader(data, batch_size=16)
    for x, y in loader:
        with run.accumulate(model):
            run.backward(loss_of(model(x), y))
        if run.step(optimizer) and run.global_step >= 3:
            break
    rank = run.rank
if prof is not None:
    prof.stop()
    trace = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(trace)
    events = json.load(open(trace))["traceEvents"]
    peak = max((e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"), default=0)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"peak": peak}, f)
"""

CASES = [
    (kind, strategy, precision, accum, "")
    for kind in ("mlp", "cnn", "gpt")
    for strategy, precision, accum in (
        ("ddp", "fp32", 1), ("fsdp", "fp32", 1), ("ddp", "bf16", 2), ("fsdp", "bf16", 2),
    )
] + [
    ("cnn", "ddp", "fp32", 1, "ac"), ("gpt", "ddp", "fp32", 1, "ac"),
    ("gpt", "fsdp", "fp32", 1, "ac"), ("gpt", "ddp", "bf16", 2, "ac"),
]  # fmt: skip
"""(model, strategy, precision, grad_accum, "ac": the real run checkpoints the blocks'
activations; the plan, of the script without it, is read from its "+ AC" row)."""
QUICK = [CASES[0], CASES[1], CASES[8], CASES[9], CASES[13]]


RUNS = 3
Case = tuple[str, str, str, int, str]


def measure(script: Path, case: Case, folder: Path) -> list[int]:
    return [measure_once(script, case, folder) for _ in range(RUNS)]


def measure_once(script: Path, case: Case, folder: Path) -> int:
    out = folder / f"peak-{'-'.join(map(str, case))}"
    env = {**os.environ, "PLAN_MEASURE": str(out), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "paratrain", "run", "--nproc", "2",
               "--run-dir", str(folder / "run"), str(script), *map(str, filter(None, case))]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(
            f"{case}: the real run failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return max(json.loads(Path(f"{out}.{r}").read_text())["peak"] for r in range(2))


def predict(script: Path, case: Case) -> dict[str, int]:
    command = [sys.executable, "-m", "paratrain", "plan", "--nproc", "2", "--json",
               str(script), *map(str, case[:4])]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{case}: plan failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    plan = json.loads(done.stdout)
    return {row["strategy"]: row["total"] for row in plan["rows"]} | {"_s": plan["seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="four cases")
    args = parser.parse_args()
    print("| model | strategy | precision | grad_accum | planned MiB | measured MiB (3 runs) "
          "| planned ÷ highest | planned ÷ lowest | plan s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    highs, lows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        script = folder / "case.py"
        script.write_text(SCRIPT)
        for case in QUICK if args.quick else CASES:
            planned = predict(script, case)
            row = (case[1] if case[1] == "ddp" else "fsdp") + (" + AC" if case[4] else "")
            measured = measure(script, case, folder)
            high, low = planned[row] / max(measured), planned[row] / min(measured)
            highs.append(high)
            lows.append(low)
            runs = ", ".join(f"{m / 2**20:.1f}" for m in measured)
            print(f"| {case[0]} | {row} | {case[2]} | {case[3]} | {planned[row] / 2**20:.1f} | "
                  f"{runs} | {high:.3f} | {low:.3f} | {planned['_s']:.1f} |", flush=True)  # fmt: skip
    inside = sum(0.9 <= r <= 1.1 for r in highs)
    print(f"\n{inside} of {len(highs)} within ±10 % of the highest measured peak; "
          f"planned ÷ highest {min(highs):.3f}-{max(highs):.3f}, "
          f"÷ lowest {min(lows):.3f}-{max(lows):.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
