"""Question-answering fine-tuning in the older transformers-examples layout (args.local_rank, trange epochs).

Planted: PT005 - `for epoch in trange(...)` runs without train_sampler.set_epoch(epoch).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm, trange
from transformers import AutoModelForQuestionAnswering, get_linear_schedule_with_warmup

from squad_features import load_and_cache_examples


def train(args, train_dataset, model):
    tb_writer = None
    if args.local_rank in [-1, 0]:
        tb_writer = SummaryWriter(args.logging_dir)
    train_sampler = DistributedSampler(train_dataset)
    train_dataloader = DataLoader(train_dataset, sampler=train_sampler, batch_size=args.per_gpu_train_batch_size)
    t_total = len(train_dataloader) // args.gradient_accumulation_steps * args.num_train_epochs
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, eps=1e-8)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=args.warmup_steps, num_training_steps=t_total)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank], output_device=args.local_rank)

    global_step = 0
    model.zero_grad()
    for epoch in trange(int(args.num_train_epochs), desc="Epoch", disable=args.local_rank not in [-1, 0]):  # planted: PT005
        for step, batch in enumerate(tqdm(train_dataloader, desc="Iteration", disable=args.local_rank not in [-1, 0])):
            model.train()
            batch = tuple(t.to(args.device) for t in batch)
            inputs = {"input_ids": batch[0], "attention_mask": batch[1], "token_type_ids": batch[2],
                      "start_positions": batch[3], "end_positions": batch[4]}
            loss = model(**inputs)[0]
            loss = loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                model.zero_grad()
                global_step += 1
                if args.local_rank in [-1, 0] and global_step % args.logging_steps == 0:
                    tb_writer.add_scalar("lr", scheduler.get_last_lr()[0], global_step)
                if args.local_rank in [-1, 0] and global_step % args.save_steps == 0:
                    output_dir = os.path.join(args.output_dir, f"checkpoint-{global_step}")
                    os.makedirs(output_dir, exist_ok=True)
                    model.module.save_pretrained(output_dir)
                    torch.save(optimizer.state_dict(), os.path.join(output_dir, "optimizer.pt"))
                    torch.save(scheduler.state_dict(), os.path.join(output_dir, "scheduler.pt"))
    if args.local_rank in [-1, 0]:
        tb_writer.close()
    return global_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="bert-base-uncased")
    parser.add_argument("--output_dir", default="out")
    parser.add_argument("--logging_dir", default="runs")
    parser.add_argument("--per_gpu_train_batch_size", type=int, default=12)
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=2)
    parser.add_argument("--num_train_epochs", type=float, default=2.0)
    parser.add_argument("--warmup_steps", type=int, default=0)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--logging_steps", type=int, default=50)
    parser.add_argument("--save_steps", type=int, default=1000)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    args = parser.parse_args()

    torch.cuda.set_device(args.local_rank)
    args.device = torch.device("cuda", args.local_rank)
    dist.init_process_group(backend="nccl")

    model = AutoModelForQuestionAnswering.from_pretrained(args.model_name_or_path).to(args.device)
    train_dataset = load_and_cache_examples(args, evaluate=False)
    global_step = train(args, train_dataset, model)
    if args.local_rank in [-1, 0]:
        print(f"global_step = {global_step}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
