"""The plain-torch original of ``nanogpt.py`` (karpathy/nanoGPT ``train.py``'s loop, one
process, no DDP), for the one-process parity test: same model, data, seed and loop.

    python nanogpt_original.py --final ckpt.pt

``--final`` is nanoGPT's ``ckpt.pt``, rewritten at every evaluation after the first. As in the
port, each micro-step draws its own batch (nanoGPT prefetches the next one).
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.ln_1 = nn.LayerNorm(n_embd, bias=False)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.ln_2 = nn.LayerNorm(n_embd, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd, bias=False),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd, bias=False),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size, dropout) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=False)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


def tokens(vocab_size: int) -> dict[str, torch.Tensor]:
    """Train and val token streams (nanoGPT memory-maps train.bin and val.bin)."""
    g = torch.Generator().manual_seed(0)
    data = (torch.arange(3000) * 7 + torch.randint(0, 3, (3000,), generator=g)) % vocab_size
    return {"train": data[:2500], "val": data[2500:]}


def main() -> None:
    parser = argparse.ArgumentParser(description="nanoGPT-shaped example")
    parser.add_argument("--max-iters", type=int, default=24)
    parser.add_argument("--eval-interval", type=int, default=6)
    parser.add_argument("--eval-iters", type=int, default=2)
    parser.add_argument("--log-interval", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=16, help="samples per iteration")
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--learning-rate", type=float, default=6e-3)
    parser.add_argument("--min-lr", type=float, default=6e-4)
    parser.add_argument("--warmup-iters", type=int, default=4)
    parser.add_argument("--lr-decay-iters", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--final", required=True, help="where ckpt.pt goes")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    gradient_accumulation_steps = args.global_batch // args.batch_size
    data = tokens(vocab_size=32)

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        source = data[split]
        ix = torch.randint(len(source) - args.block_size, (args.batch_size,))
        x = torch.stack([source[i : i + args.block_size] for i in ix])
        y = torch.stack([source[i + 1 : i + 1 + args.block_size] for i in ix])
        return x, y

    model_args = dict(
        n_layer=2, n_head=2, n_embd=16, block_size=args.block_size, vocab_size=32, dropout=0.1
    )
    model = GPT(**model_args)
    optimizer = model.configure_optimizers(0.1, args.learning_rate, (0.9, 0.95))
    iter_num = 0
    best_val_loss = 1e9

    @torch.no_grad()
    def estimate_loss() -> dict[str, float]:
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(args.eval_iters)
            for k in range(args.eval_iters):
                _, loss = model(*get_batch(split))
                losses[k] = loss.item()
            out[split] = float(losses.mean())
        model.train()
        return out

    def get_lr(it: int) -> float:
        if it < args.warmup_iters:
            return args.learning_rate * (it + 1) / (args.warmup_iters + 1)
        if it > args.lr_decay_iters:
            return args.min_lr
        decay_ratio = (it - args.warmup_iters) / (args.lr_decay_iters - args.warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
        return args.min_lr + coeff * (args.learning_rate - args.min_lr)

    while True:
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        if iter_num % args.eval_interval == 0:
            losses = estimate_loss()
            print(
                f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
            )
            best_val_loss = min(best_val_loss, losses["val"])
            if iter_num > 0:  # always_save_checkpoint
                checkpoint = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "model_args": model_args,
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                    "config": vars(args),
                }
                torch.save(checkpoint, args.final)
        for _micro_step in range(gradient_accumulation_steps):
            X, Y = get_batch("train")
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if iter_num % args.log_interval == 0:
            print(f"iter {iter_num}: loss {loss.item():.4f}, lr {lr:.2e}")
        iter_num += 1
        if iter_num > args.max_iters:
            break


if __name__ == "__main__":
    main()
