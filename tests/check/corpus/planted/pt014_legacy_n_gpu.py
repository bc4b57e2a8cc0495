"""GLUE fine-tuning in the legacy run_glue.py shape: local_rank == -1 means one process driving all GPUs.

Planted: PT014 - with several GPUs and no launcher the model goes through torch.nn.DataParallel
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForSequenceClassification, get_linear_schedule_with_warmup

from glue_data import load_and_cache_examples

logger = logging.getLogger(__name__)


def train(args, train_dataset, model):
    if args.local_rank == -1:
        train_sampler = RandomSampler(train_dataset)
    else:
        train_sampler = DistributedSampler(train_dataset)
    train_dataloader = DataLoader(train_dataset, sampler=train_sampler, batch_size=args.train_batch_size)
    t_total = len(train_dataloader) * args.num_train_epochs

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, eps=1e-8)
    scheduler = get_linear_schedule_with_warmup(optimizer, args.warmup_steps, t_total)

    if args.n_gpu > 1:
        model = torch.nn.DataParallel(model)  # planted: PT014
    if args.local_rank != -1:
        model = DistributedDataParallel(model, device_ids=[args.local_rank], output_device=args.local_rank)

    global_step = 0
    model.zero_grad()
    for epoch in range(int(args.num_train_epochs)):
        if args.local_rank != -1:
            train_sampler.set_epoch(epoch)
        for step, batch in enumerate(train_dataloader):
            model.train()
            batch = tuple(t.to(args.device) for t in batch)
            inputs = {"input_ids": batch[0], "attention_mask": batch[1], "labels": batch[3]}
            loss = model(**inputs)[0]
            if args.n_gpu > 1:
                loss = loss.mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            scheduler.step()
            model.zero_grad()
            global_step += 1
            if args.local_rank in [-1, 0] and global_step % args.logging_steps == 0:
                logger.info("step %d lr %.3e loss %.4f", global_step, scheduler.get_last_lr()[0], loss.item())
    return model, global_step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name_or_path", default="roberta-base")
    parser.add_argument("--data_dir", default="./glue/MRPC")
    parser.add_argument("--output_dir", default="./out")
    parser.add_argument("--per_gpu_train_batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=2e-5)
    parser.add_argument("--num_train_epochs", type=float, default=3.0)
    parser.add_argument("--warmup_steps", type=int, default=0)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--logging_steps", type=int, default=50)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    args = parser.parse_args()

    if args.local_rank == -1:
        args.device = torch.device("cuda")
        args.n_gpu = torch.cuda.device_count()
    else:
        torch.cuda.set_device(args.local_rank)
        args.device = torch.device("cuda", args.local_rank)
        dist.init_process_group(backend="nccl")
        args.n_gpu = 1
    args.train_batch_size = args.per_gpu_train_batch_size * max(1, args.n_gpu)
    logging.basicConfig(level=logging.INFO if args.local_rank in [-1, 0] else logging.WARN)

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model.to(args.device)
    train_dataset = load_and_cache_examples(args, evaluate=False)
    model, global_step = train(args, train_dataset, model)

    if args.local_rank == -1 or dist.get_rank() == 0:
        os.makedirs(args.output_dir, exist_ok=True)
        model_to_save = model.module if hasattr(model, "module") else model
        torch.save(model_to_save.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))
        logger.info("saved after %d steps", global_step)


if __name__ == "__main__":
    main()
