"""Causal LM fine-tuning in the run_clm_no_trainer shape, on plain torch.distributed (aliased as tdist).

Planted: PT016 - load_training_state() (called by every rank on --resume) prints the resumed step
"""
import argparse
import math
import os

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForCausalLM, default_data_collator, get_scheduler

from lm_data import build_lm_datasets


def is_main(args):
    return args.local_rank == -1 or tdist.get_rank() == 0


def load_training_state(path, model, optimizer, lr_scheduler, device):
    state = torch.load(path, map_location=device, weights_only=True)
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    lr_scheduler.load_state_dict(state["lr_scheduler"])
    print(f"Resumed from checkpoint {path} at step {state['completed_steps']}")  # planted: PT016
    return state["completed_steps"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="gpt2")
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--max_train_steps", type=int, default=20000)
    parser.add_argument("--checkpointing_steps", type=int, default=1000)
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--output_dir", default="clm_out")
    args = parser.parse_args()

    args.local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.local_rank)
    tdist.init_process_group(backend="nccl")
    device = torch.device("cuda", args.local_rank)

    train_dataset = build_lm_datasets(args.model_name_or_path, block_size=1024)["train"]
    sampler = DistributedSampler(train_dataset)
    train_dataloader = DataLoader(train_dataset, sampler=sampler, collate_fn=default_data_collator,
                                  batch_size=args.per_device_train_batch_size)

    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).to(device)
    model = DDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=500,
                                 num_training_steps=args.max_train_steps)

    completed_steps = 0
    if args.resume_from_checkpoint:
        completed_steps = load_training_state(args.resume_from_checkpoint, model, optimizer,
                                              lr_scheduler, device)

    epoch = completed_steps // len(train_dataloader)
    sampler.set_epoch(epoch)
    batches = iter(train_dataloader)
    model.train()
    while completed_steps < args.max_train_steps:
        batch = next(batches, None)
        if batch is None:
            epoch += 1
            sampler.set_epoch(epoch)
            batches = iter(train_dataloader)
            continue
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        completed_steps += 1

        if is_main(args) and completed_steps % 100 == 0:
            print(f"step {completed_steps}: loss {loss.item():.4f} ppl {math.exp(loss.item()):.2f}")
        if completed_steps % args.checkpointing_steps == 0 and is_main(args):
            os.makedirs(args.output_dir, exist_ok=True)
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "lr_scheduler": lr_scheduler.state_dict(), "completed_steps": completed_steps},
                       os.path.join(args.output_dir, f"step_{completed_steps}.pt"))

    tdist.destroy_process_group()


if __name__ == "__main__":
    main()
