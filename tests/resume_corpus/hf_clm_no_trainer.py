"""Hugging Face ``examples/pytorch/language-modeling/run_clm_no_trainer.py``, ported to paratrain
(a tiny causal LM on generated tokens in place of a Hub model and dataset).

    python hf_clm_no_trainer.py [--num_train_epochs 3] [--resume_from_checkpoint [PATH]]
    paratrain run --nproc 2 hf_clm_no_trainer.py

Shape: ``group_texts`` into blocks whose labels are the inputs; batches as dicts of tensors
(``model(**batch)`` returns an output with ``.loss``); AdamW over a decay and a no-decay group;
``num_update_steps_per_epoch`` and ``max_train_steps`` from ``len(train_dataloader)``; a linear
schedule with warm-up stepped with every optimizer step; gradient accumulation;
``completed_steps`` counted on synchronised steps; ``checkpointing_steps`` saves every N steps
(or ``"epoch"``); an evaluation pass with perplexity every epoch; ``--resume_from_checkpoint``
with HF's bookkeeping (``starting_epoch``, ``completed_steps``; paratrain's loader continues
mid-epoch, so no ``skip_first_batches``); the model written at the end (``save_pretrained``).
"""

from __future__ import annotations

import argparse
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

import paratrain as pt


class CausalLMOutput(NamedTuple):
    loss: torch.Tensor | None
    logits: torch.Tensor


class TinyConfig(NamedTuple):
    vocab_size: int = 32
    n_embd: int = 16
    n_positions: int = 16
    dropout: float = 0.1


class TinyCausalLM(nn.Module):
    """An embedding, one causal convolution over the previous token, a feed-forward layer."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.n_positions, config.n_embd)
        self.mix = nn.Linear(2 * config.n_embd, config.n_embd)
        self.LayerNorm = nn.LayerNorm(config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def forward(self, input_ids, attention_mask=None, labels=None) -> CausalLMOutput:
        pos = torch.arange(input_ids.size(1), device=input_ids.device)
        h = self.wte(input_ids) + self.wpe(pos)
        previous = F.pad(h, (0, 0, 1, 0))[:, :-1]
        h = self.drop(torch.tanh(self.mix(torch.cat([h, previous], dim=-1))))
        logits = self.lm_head(self.LayerNorm(h))
        if attention_mask is not None:
            logits = logits * attention_mask.unsqueeze(-1)
        loss = None
        if labels is not None:
            shift_logits = logits[:, :-1].reshape(-1, logits.size(-1))
            loss = F.cross_entropy(shift_logits, labels[:, 1:].reshape(-1))
        return CausalLMOutput(loss, logits)


def group_texts(token_ids: list[int], block_size: int) -> list[dict[str, torch.Tensor]]:
    """Concatenated texts cut into blocks; the small remainder is dropped."""
    total_length = len(token_ids) // block_size * block_size
    blocks = [
        torch.tensor(token_ids[i : i + block_size]) for i in range(0, total_length, block_size)
    ]
    return [
        {"input_ids": b, "attention_mask": torch.ones_like(b), "labels": b.clone()} for b in blocks
    ]


def raw_datasets(vocab_size: int) -> dict[str, list[int]]:
    """Token ids of generated "texts" (a Hub dataset and tokenizer would need a download)."""
    g = torch.Generator().manual_seed(0)
    ids = (torch.arange(2600) * 5 + torch.randint(0, 2, (2600,), generator=g)) % vocab_size
    return {"train": ids[:2048].tolist(), "validation": ids[2048:].tolist()}


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    def lr_lambda(current_step: int) -> float:
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        remaining = num_training_steps - current_step
        return max(0.0, float(remaining) / float(max(1, num_training_steps - num_warmup_steps)))

    return LambdaLR(optimizer, lr_lambda)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="run_clm_no_trainer-shaped example")
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--max_train_steps", type=int, default=None)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--num_warmup_steps", type=int, default=3)
    parser.add_argument("--block_size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--checkpointing_steps", default="5", help="save every N optimizer steps, or 'epoch'"
    )
    parser.add_argument(
        "--resume_from_checkpoint",
        nargs="?",
        const="",
        default=None,
        help="resume from the newest checkpoint (no path needed: the run dir holds them)",
    )
    parser.add_argument("--with_tracking", action="store_true", default=True)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    run = pt.Run(seed=args.seed, grad_accum=args.gradient_accumulation_steps, progress=False)
    config = TinyConfig(n_positions=args.block_size)
    model = TinyCausalLM(config)
    embedding_size = model.get_input_embeddings().weight.shape[0]
    assert embedding_size == config.vocab_size

    lm_datasets = {k: group_texts(v, args.block_size) for k, v in raw_datasets(32).items()}
    train_dataset, eval_dataset = lm_datasets["train"], lm_datasets["validation"]
    train_dataloader = run.loader(train_dataset, batch_size=args.per_device_train_batch_size)
    eval_dataloader = run.eval_loader(eval_dataset, batch_size=args.per_device_eval_batch_size)

    no_decay = ["bias", "LayerNorm.weight"]
    optimizer_grouped_parameters = [
        {
            "params": [
                p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)
            ],
            "weight_decay": args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(optimizer_grouped_parameters, lr=args.learning_rate)
    model, optimizer = run.setup(model, optimizer)

    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    if args.max_train_steps is None:
        args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer, args.num_warmup_steps, args.max_train_steps
    )
    checkpointing_steps = args.checkpointing_steps
    if checkpointing_steps is not None and checkpointing_steps.isdigit():
        checkpointing_steps = int(checkpointing_steps)

    total_batch_size = (
        args.per_device_train_batch_size * run.world_size * args.gradient_accumulation_steps
    )
    run.print(
        f"  Num examples = {len(train_dataset)}, total train batch size = "
        f"{total_batch_size}, total optimization steps = {args.max_train_steps}"
    )
    completed_steps = 0
    starting_epoch = 0
    if args.resume_from_checkpoint is not None and run.resume(scheduler=lr_scheduler):
        run.print(f"Resumed from checkpoint: {run.resumed_from}")
    completed_steps = run.global_step
    starting_epoch = run.epoch
    run.print(f"starting at epoch {starting_epoch}, step {completed_steps}")

    for epoch in run.epochs(args.num_train_epochs):
        model.train()
        total_loss = 0.0
        for _step, batch in enumerate(train_dataloader):
            with run.accumulate(model):
                outputs = model(**batch)
                loss = outputs.loss
                total_loss += loss.detach().float().item()
                run.backward(loss)
            if run.step(optimizer, lr_scheduler):
                completed_steps += 1
                if (
                    isinstance(checkpointing_steps, int)
                    and completed_steps % checkpointing_steps == 0
                ):
                    run.save(extras={"completed_steps": completed_steps})
            if completed_steps >= args.max_train_steps:
                break

        model.eval()
        losses = []
        for batch in eval_dataloader:
            with torch.no_grad():
                outputs = model(**batch)
            losses.append(outputs.loss.item() * batch["input_ids"].size(0))
        eval_loss = run.reduce(sum(losses), "sum") / len(eval_dataset)
        try:
            perplexity = math.exp(eval_loss)
        except OverflowError:
            perplexity = float("inf")
        run.print(f"epoch {epoch}: perplexity: {perplexity} eval_loss: {eval_loss}")
        if args.with_tracking:
            run.log(
                {
                    "perplexity": perplexity,
                    "eval_loss": eval_loss,
                    "train_loss": total_loss / len(train_dataloader),
                    "epoch": epoch,
                },
                step=completed_steps,
            )
        if checkpointing_steps == "epoch":
            run.save(extras={"completed_steps": completed_steps})

    run.save_weights(model, run.run_dir / "pytorch_model.pt")  # save_pretrained
    run.close()


if __name__ == "__main__":
    main()
