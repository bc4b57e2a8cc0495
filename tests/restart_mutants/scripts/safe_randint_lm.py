"""A character-level language model in a ``while`` loop (nanoGPT's ``get_batch``): random
windows drawn with ``torch.randint`` from the global generator; every 5 steps an estimate of the
loss on random batches (more draws), then a save that keeps it in the extras.
"""

from __future__ import annotations

import torch
from torch import nn

import paratrain as pt

VOCAB = 12
BLOCK = 8
BATCH = 6
MAX_STEPS = 20


def main() -> None:
    g = torch.Generator().manual_seed(0)
    corpus = (torch.arange(600) * 5 + torch.randint(0, 3, (600,), generator=g)) % VOCAB

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(corpus) - BLOCK - 1, (BATCH,))
        x = torch.stack([corpus[i : i + BLOCK] for i in ix])
        y = torch.stack([corpus[i + 1 : i + 1 + BLOCK] for i in ix])
        return x.to(run.device), y.to(run.device)

    run = pt.Run(progress=False, timeout_s=30)
    net = nn.Sequential(nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB))
    model, optimizer = run.setup(net, torch.optim.AdamW(net.parameters(), lr=3e-2))

    @torch.no_grad()
    def estimate_loss() -> float:
        model.eval()
        losses = []
        for _ in range(3):
            x, y = get_batch()
            losses.append(float(nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())))
        model.train()
        return sum(losses) / len(losses)

    run.resume()
    while run.global_step < MAX_STEPS:
        x, y = get_batch()
        run.backward(nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()))
        run.step(optimizer)
        if run.global_step % 5 == 0:
            run.save(extras={"val_loss": estimate_loss()})
    run.close()


if __name__ == "__main__":
    main()
