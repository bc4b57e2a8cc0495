"""karpathy/minGPT ``mingpt/trainer.py``, ported to paratrain (the demo's sort task).

    python mingpt_trainer.py [--max-iters 30]
    paratrain run --nproc 2 mingpt_trainer.py

Shape: a ``while True`` loop pulling batches with ``next(data_iter)`` and starting a new
``iter(train_loader)`` on ``StopIteration``; samples drawn from the global generator in the
dataset's ``__getitem__``; AdamW with decay and no-decay groups sorted by parameter name (an
order unlike ``model.parameters()``); the script's own ``clip_grad_norm_(model.parameters(),
1.0)`` as ``max_grad_norm=1.0``; an ``on_batch_end`` callback that logs and saves every 8
iterations; the loop ends at ``max_iters``, counted by ``run.global_step`` (minGPT's
``iter_num``).
"""

from __future__ import annotations

import argparse

import torch
from mingpt_model import GPT, SortDataset

import paratrain as pt


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-iters", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    run = pt.Run(seed=args.seed, max_grad_norm=1.0, progress=False)
    train_dataset = SortDataset()
    model = GPT()
    optimizer = model.configure_optimizers(lr=5e-4, weight_decay=0.1)
    model, optimizer = run.setup(model, optimizer)
    train_loader = run.loader(train_dataset, batch_size=args.batch_size)
    run.resume()

    def on_batch_end(loss: torch.Tensor) -> None:
        if run.global_step % 8 == 0 or run.global_step >= args.max_iters:
            run.print(f"iter {run.global_step}: train loss {loss.item():.5f}")
            run.save()

    model.train()
    data_iter = iter(train_loader)
    while run.global_step < args.max_iters:
        try:
            batch = next(data_iter)
        except StopIteration:
            data_iter = iter(train_loader)
            batch = next(data_iter)
        x, y = batch
        _, loss = model(x, y)
        run.backward(loss)
        run.step(optimizer)
        on_batch_end(loss)
    run.close()


if __name__ == "__main__":
    main()
