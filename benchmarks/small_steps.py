"""Small steps: paratrain's loop against the plain DataLoader loop, Accelerate's and Fabric's,
where per-step bookkeeping shows most (a tiny model, in-memory data, one thread).

    python benchmarks/small_steps.py               # step p50: 0.32 ms on 2 CPU cores, 3.1 on H100
    python benchmarks/small_steps.py --budget 120  # any `paratrain bench` flag overrides it

A preset of `paratrain bench`: on CPU an MLP (256 -> 64 -> 64 -> 10) on batches of 32 read
from a TensorDataset; on a GPU a small CNN on 8x8 images, batches of 128; 45 steps per epoch,
as in the tutorials' digits-sized datasets. All four loops run in
the same process, in alternating blocks; "paratrain/reference" is paratrain's throughput ÷ the
hand-written DataLoader loop's (target >= 0.95), and each peer gets its own ratio against the
same reference blocks.
"""

from __future__ import annotations

import sys

import torch

from paratrain.commands.cli import main

COMMON = ["bench", "--nproc", "1", "--data", "loader", "--epoch-batches", "45", "--threads", "1",
          "--compare", "accelerate,fabric", "--warmup", "50", "--rounds", "15",
          "--spread", "0.02", "--budget", "90", "--no-plot"]  # fmt: skip
CPU = ["--model", "mlp", "--width", "64", "--depth", "2", "--batch-size", "32",
       "--strategies", "cpu", "--steps", "200",
       "--run-dir", "runs/bench/small_steps_cpu"]  # fmt: skip
GPU = ["--model", "cnn", "--width", "16", "--depth", "2", "--image-size", "8",
       "--batch-size", "128", "--strategies", "single", "--steps", "100",
       "--run-dir", "runs/bench/small_steps_gpu"]  # fmt: skip

if __name__ == "__main__":
    preset = COMMON + (GPU if torch.cuda.is_available() else CPU)
    sys.exit(main(preset + sys.argv[1:]))
