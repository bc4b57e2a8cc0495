"""paratrain's training loop vs the tutorials' hand-written DDP loop, at world size 1 and 2.

    python benchmarks/overhead.py                     # the preset below
    python benchmarks/overhead.py --nproc 1,2,4       # any `paratrain bench` flag overrides it

A preset of `paratrain bench`: an MLP fed through a DataLoader with a DistributedSampler (the
tutorials' template) against `run.loader`, DDP over gloo, 9 alternating rounds of 200 steps; the
"paratrain/reference" column is paratrain's throughput ÷ the hand-written loop's (target >= 0.99).
"""

from __future__ import annotations

import sys

from paratrain.commands.cli import main

PRESET = [
    "bench",
    "--model",
    "mlp",
    "--width",
    "512",
    "--depth",
    "2",
    "--strategies",
    "ddp",
    "--nproc",
    "1,2",
    "--data",
    "loader",
    "--batch-size",
    "64",
    "--steps",
    "200",
    "--warmup",
    "20",
    "--rounds",
    "9",
    "--run-dir",
    "runs/bench/overhead",
    "--no-plot",
]

if __name__ == "__main__":
    sys.exit(main(PRESET + sys.argv[1:]))
