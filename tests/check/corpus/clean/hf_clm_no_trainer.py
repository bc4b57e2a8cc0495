"""HF run_clm_no_trainer shape on plain DDP: dict batches, zero-first preprocessing, no_sync accumulation, perplexity from summed loss."""
import argparse
import logging
import math
import os
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from datasets import load_dataset
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, default_data_collator, get_scheduler

logger = logging.getLogger(__name__)


@contextmanager
def torch_distributed_zero_first(local_rank: int):
    if local_rank not in [-1, 0]:
        dist.barrier()
    yield
    if local_rank == 0:
        dist.barrier()


def parse_args():
    p = argparse.ArgumentParser(description="Finetune a causal LM")
    p.add_argument("--model_name_or_path", required=True)
    p.add_argument("--dataset_name", default="wikitext")
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--num_train_epochs", type=int, default=3)
    p.add_argument("--gradient_accumulation_steps", type=int, default=4)
    p.add_argument("--block_size", type=int, default=512)
    p.add_argument("--output_dir", default="clm-out")
    return p.parse_args()


def main():
    args = parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    device = torch.device("cuda", local_rank)
    is_main = dist.get_rank() == 0
    logging.basicConfig(level=logging.INFO if is_main else logging.ERROR)

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).to(device)
    raw = load_dataset(args.dataset_name, "wikitext-2-raw-v1")

    def tokenize(examples):
        return tokenizer(examples["text"])

    def group_texts(examples):
        concatenated = {k: sum(examples[k], []) for k in examples.keys()}
        total = (len(concatenated["input_ids"]) // args.block_size) * args.block_size
        result = {k: [t[i:i + args.block_size] for i in range(0, total, args.block_size)]
                  for k, t in concatenated.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    with torch_distributed_zero_first(local_rank):
        tokenized = raw.map(tokenize, batched=True, remove_columns=["text"])
        lm_datasets = tokenized.map(group_texts, batched=True)
    train_dataset, eval_dataset = lm_datasets["train"], lm_datasets["validation"]

    train_sampler = DistributedSampler(train_dataset, shuffle=True)
    train_dataloader = DataLoader(train_dataset, sampler=train_sampler, collate_fn=default_data_collator,
                                  batch_size=args.per_device_train_batch_size)
    eval_dataloader = DataLoader(eval_dataset, sampler=DistributedSampler(eval_dataset, shuffle=False),
                                 collate_fn=default_data_collator, batch_size=args.per_device_train_batch_size)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=max_train_steps)
    logger.info("***** Running training *****")
    progress_bar = tqdm(range(max_train_steps), disable=not is_main)
    completed_steps = 0
    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = {k: v.to(device) for k, v in batch.items()}
            sync_now = (step + 1) % args.gradient_accumulation_steps == 0 or step == len(train_dataloader) - 1
            with (nullcontext() if sync_now else model.no_sync()):
                outputs = model(**batch)
                loss = outputs.loss / args.gradient_accumulation_steps
                loss.backward()
            if sync_now:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
                progress_bar.update(1)
                completed_steps += 1
        model.eval()
        loss_sum = torch.zeros(2, device=device)
        for batch in eval_dataloader:
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad():
                outputs = model(**batch)
            loss_sum[0] += outputs.loss.detach() * batch["input_ids"].size(0)
            loss_sum[1] += batch["input_ids"].size(0)
        dist.all_reduce(loss_sum)
        eval_loss = (loss_sum[0] / loss_sum[1]).item()
        try:
            perplexity = math.exp(eval_loss)
        except OverflowError:
            perplexity = float("inf")
        logger.info(f"epoch {epoch}: perplexity: {perplexity} eval_loss: {eval_loss}")
    if is_main:
        model.module.save_pretrained(args.output_dir)
        tokenizer.save_pretrained(args.output_dir)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
