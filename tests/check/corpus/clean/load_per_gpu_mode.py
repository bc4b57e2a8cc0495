"""ImageNet-style resume that supports both one process per GPU and one process for all GPUs.

With one process per GPU (``args.gpu`` set) the checkpoint is mapped onto that GPU; with one
process driving every GPU (``args.gpu is None``, DataParallel) there is no rank to map to and the
tensors go back where they were saved. Only the evaluation summary is loaded on rank 0 alone.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn


def resume(model: nn.Module, path: str, gpu: int | None) -> int:
    if gpu is None:
        checkpoint = torch.load(path, weights_only=True)
    else:
        checkpoint = torch.load(path, map_location=f"cuda:{gpu}", weights_only=True)
    model.load_state_dict(checkpoint["state_dict"])
    return checkpoint["epoch"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", type=int, default=None)
    parser.add_argument("--resume", default="")
    args = parser.parse_args()
    dist.init_process_group("nccl")
    model = nn.Linear(8, 2).cuda() if args.gpu is None else nn.Linear(8, 2).cuda(args.gpu)
    start = resume(model, args.resume, args.gpu) if os.path.isfile(args.resume) else 0
    if dist.get_rank() == 0:
        summary = torch.load("eval_summary.pt", weights_only=True)  # one process reads it: no rank fills GPU 0
        print(f"resumed at epoch {start}; best so far {summary['best']:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
