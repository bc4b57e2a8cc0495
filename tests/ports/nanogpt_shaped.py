"""A nanoGPT-shaped training script ported to paratrain (run by tests/ports/test_nanogpt.py).

    paratrain run --nproc 2 --max-restarts 1 --run-dir OUT tests/ports/nanogpt_shaped.py \
        [--kill-rank R --kill-step S]

Own ``while`` loop on ``run.global_step``, batches drawn with ``torch.randint`` (per-rank after
``run.setup``), grad accumulation derived from a global batch, eval and save every few iterations
on every rank, model arguments read from the newest checkpoint before the model is built.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
from torch import nn

import paratrain as pt

BLOCK, VOCAB = 8, 32


class TinyGPT(nn.Module):
    def __init__(self, n_embd: int, vocab: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Parameter(torch.zeros(BLOCK, n_embd))
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Dropout(0.1))
        self.head = nn.Linear(4 * n_embd, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.mlp(self.tok(idx) + self.pos))
        return nn.functional.cross_entropy(logits.float().view(-1, VOCAB), targets.view(-1))


def get_batch(data: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - BLOCK - 1, (batch_size,))
    x = torch.stack([data[i : i + BLOCK] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in ix])
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=-1)
    args = parser.parse_args()
    max_iters, eval_interval, micro = 12, 4, 4
    kill = (args.kill_rank, args.kill_step)
    run = pt.Run(
        global_batch=16,
        per_rank_batch=micro,
        precision="bf16",
        progress=False,
        seed=1337,
        timeout_s=60,
    )
    data = (torch.arange(2000) * 7 % VOCAB).long()  # the "memory-mapped token file"
    info = run.latest_checkpoint()
    model_args = info.extras["model_args"] if info else {"n_embd": 16, "vocab": VOCAB}
    model = TinyGPT(**model_args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = run.setup(model, optimizer)
    run.resume()
    best_val = run.extras.get("best_val_loss", 1e9)
    accum = 16 // (micro * run.world_size)
    assert run.loop.grad_accum == accum
    while run.global_step < max_iters:
        for _ in range(accum):
            x, y = get_batch(data, micro)
            with run.accumulate(model):
                run.backward(model(x, y))
        run.step(optimizer)
        if run.global_step % eval_interval == 0:
            model.eval()
            with torch.no_grad():
                val = run.reduce(float(model(*get_batch(data, micro))), "mean")
            model.train()
            best_val = min(best_val, val)
            run.save(extras={"model_args": model_args, "best_val_loss": best_val})
        killed = (run.restart_count, run.rank, run.global_step) == (0, *kill)
        if killed:
            os.kill(os.getpid(), signal.SIGKILL)
    run.save_weights(model, run.run_dir / "final.pt")
    run.close()


if __name__ == "__main__":
    main()
