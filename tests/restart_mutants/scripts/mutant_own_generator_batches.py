"""Not restart-safe (copy of safe_randint_lm.py): ``get_batch`` draws its windows from a
``torch.Generator`` made by the script, which no checkpoint holds (paratrain saves the global
generators, not the script's own instances).

After a resume the generator starts again from its seed, so the resumed steps train on the
windows of the run's first steps. Expected first difference: the model's weights
(``rank 0/models/model/0.weight``).
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

    batches = torch.Generator().manual_seed(1)

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(corpus) - BLOCK - 1, (BATCH,), generator=batches)
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
