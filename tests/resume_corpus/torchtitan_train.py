"""pytorch/torchtitan ``torchtitan/train.py``, ported to paratrain (a 1-layer Llama-like model
on generated tokens).

    python torchtitan_train.py [--steps 20]
    paratrain run --nproc 2 torchtitan_train.py

Shape: a ``Trainer`` object that holds the model, optimizer, LR scheduler, data loader and a
``TrainState`` (``step``, ``ntokens_seen``: a Stateful handed to the checkpointer, here
``run.track``); ``train()`` makes one data iterator, ``batch_generator``, that lives across steps
(and, the loader being finite, across passes of it); ``while train_state.step < steps`` increments
the step *before* ``train_step``, which pulls ``grad_accum`` micro-batches from the iterator (the
count derived from a global batch); the scheduler (linear warm-up, linear decay) steps with every
optimizer step; ``checkpointer.save(step, last_step=...)`` saves every ``interval`` steps and at
the last one.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import TensorDataset

import paratrain as pt


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.attention_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs, seqlen, dim = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(dim, dim=-1)
        q, k, v = (t.view(bs, seqlen, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        h = x + self.wo(
            F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(x.shape)
        )
        y = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(y)) * self.w3(y))


class Transformer(nn.Module):
    def __init__(self, vocab_size: int, dim: int, n_layers: int, n_heads: int, seq_len: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.pos = nn.Parameter(torch.zeros(seq_len, dim))
        self.layers = nn.ModuleList(
            TransformerBlock(dim, n_heads, 2 * dim) for _ in range(n_layers)
        )
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)

    def init_weights(self) -> None:
        nn.init.normal_(self.tok_embeddings.weight)
        for layer in self.layers:
            for linear in (layer.wqkv, layer.wo, layer.w1, layer.w2, layer.w3):
                nn.init.trunc_normal_(linear.weight, mean=0.0, std=0.02)
        nn.init.trunc_normal_(self.output.weight, std=self.output.in_features**-0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) + self.pos[: tokens.size(1)]
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


@dataclass
class TrainState:
    """torchtitan's Stateful train state: what the checkpoint keeps beside model and optimizer."""

    step: int = 0
    ntokens_seen: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = state_dict["step"]
        self.ntokens_seen = state_dict["ntokens_seen"]


def linear_warmup_linear_decay(warmup_steps: int, decay_steps: int):
    def lr_lambda(current_step: int) -> float:
        if current_step < warmup_steps:
            return (current_step + 1) / (warmup_steps + 1)
        progress = (current_step - warmup_steps) / max(1, decay_steps)
        return max(0.1, 1.0 - progress)

    return lr_lambda


def token_dataset(seq_len: int, vocab_size: int) -> TensorDataset:
    """Input and label windows of generated tokens (torchtitan reads a tokenized HF dataset)."""
    g = torch.Generator().manual_seed(0)
    stream = (
        torch.arange(256 * (seq_len + 1)) * 3
        + torch.randint(0, 2, (256 * (seq_len + 1),), generator=g)
    ) % vocab_size
    windows = stream.view(256, seq_len + 1)
    return TensorDataset(windows[:, :-1], windows[:, 1:])


class Trainer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = run = pt.Run(seed=args.seed, global_batch=args.global_batch, progress=False)
        model = Transformer(32, args.dim, args.n_layers, args.n_heads, args.seq_len)
        model.init_weights()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
        self.lr_schedulers = LambdaLR(optimizer, linear_warmup_linear_decay(2, args.steps))
        self.model, self.optimizer = run.setup(model, optimizer, scheduler=self.lr_schedulers)
        self.dataloader = run.loader(
            token_dataset(args.seq_len, 32), batch_size=args.local_batch_size, drop_last=True
        )
        self.gradient_accumulation_steps = run.config.grad_accum
        self.train_state = run.track(TrainState(), name="train_state")
        run.resume()  # checkpointer.load(step=-1): the newest checkpoint, if any

    def batch_generator(self, data_iterable) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:  # torchtitan's datasets are infinite; this loader starts another pass
            for inputs, labels in data_iterable:
                self.train_state.ntokens_seen += labels.numel()
                yield inputs, labels

    def train_step(self, data_iterator) -> float:
        run, model = self.run, self.model
        losses = []
        for _microbatch in range(self.gradient_accumulation_steps):
            inputs, labels = next(data_iterator)
            with run.accumulate(model):
                pred = model(inputs)
                loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
                run.backward(loss)
            losses.append(loss.detach())
        run.step(self.optimizer, self.lr_schedulers)
        return run.reduce(float(torch.stack(losses).mean()), "mean")

    def train(self) -> None:
        data_iterator = self.batch_generator(self.dataloader)
        while self.train_state.step < self.args.steps:
            self.train_state.step += 1
            loss = self.train_step(data_iterator)
            if self.train_state.step % self.args.log_freq == 0:
                self.run.print(
                    f"step: {self.train_state.step:2}  loss: {loss:7.4f}  "
                    f"tokens: {self.train_state.ntokens_seen}"
                )
            last_step = self.train_state.step == self.args.steps
            if self.train_state.step % self.args.interval == 0 or last_step:
                self.run.save()  # checkpointer.save(step, last_step=last_step)
        self.run.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="torchtitan-shaped example")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--interval", type=int, default=6, help="checkpoint every N steps")
    parser.add_argument("--local-batch-size", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=8)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--n-layers", type=int, default=1)
    parser.add_argument("--n-heads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=8e-3)
    parser.add_argument("--log-freq", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    Trainer(parser.parse_args()).train()


if __name__ == "__main__":
    main()
