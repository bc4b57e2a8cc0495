"""The plain-torch original of ``mingpt_trainer.py``: karpathy/minGPT's ``Trainer.run`` loop,
same model, data, seed and loop, no paratrain.

    python mingpt_trainer_original.py --final weights.pt

minGPT samples with ``RandomSampler(replacement=True)``; here the loader shuffles with a
one-replica ``DistributedSampler`` whose epoch advances at each new ``iter()``, the order
paratrain's loader gives a loop that starts a second pass.
"""

from __future__ import annotations

import argparse

import torch
from mingpt_model import GPT, SortDataset
from torch.utils.data import DataLoader, DistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-iters", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--final", required=True)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    train_dataset = SortDataset()
    model = GPT()
    optimizer = model.configure_optimizers(lr=5e-4, weight_decay=0.1)
    sampler = DistributedSampler(train_dataset, num_replicas=1, rank=0, seed=args.seed)
    train_loader = DataLoader(train_dataset, sampler=sampler, batch_size=args.batch_size)
    model.train()
    iter_num, passes = 0, 0
    data_iter = iter(train_loader)
    while True:
        try:
            batch = next(data_iter)
        except StopIteration:
            passes += 1
            sampler.set_epoch(passes)
            data_iter = iter(train_loader)
            batch = next(data_iter)
        x, y = batch
        _, loss = model(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        iter_num += 1
        if iter_num >= args.max_iters:
            break
    torch.save({"model": model.state_dict()}, args.final)


if __name__ == "__main__":
    main()
