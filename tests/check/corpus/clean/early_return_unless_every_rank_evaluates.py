"""Evaluation that every rank joins when the model is sharded, and rank 0 alone runs otherwise.

With a sharded (FSDP) model every rank holds a piece of the weights, so every rank must take
part in evaluation and its reductions; with a replicated model only rank 0 evaluates. The early
return is taken by the other ranks only in the replicated case, so under ``sharded_eval`` every
rank reaches the all_reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def evaluate(model: nn.Module, batches: list[torch.Tensor], sharded_eval: bool) -> float:
    is_main = dist.get_rank() == 0
    if not sharded_eval and not is_main:
        return 0.0
    total = torch.zeros(2)
    with torch.no_grad():
        for x in batches:
            total[0] += model(x).pow(2).sum()
            total[1] += x.shape[0]
    if sharded_eval:
        dist.all_reduce(total)
    return (total[0] / total[1]).item()


def main() -> None:
    dist.init_process_group("gloo")
    model = nn.Linear(16, 1)
    batches = [torch.randn(8, 16) for _ in range(4)]
    score = evaluate(model, batches, sharded_eval=True)
    if dist.get_rank() == 0:
        print(f"eval: {score:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
