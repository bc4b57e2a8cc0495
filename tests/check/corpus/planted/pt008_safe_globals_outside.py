"""Seq2seq summarization fine-tuning (plain torch DDP); the teacher is read under safe_globals, the resume checkpoint is not.

Planted: PT008 - the resume torch.load sits outside the safe_globals block and passes no weights_only=.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from summ_data import SummarizationDataset, TrainConfig


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="t5-base")
    p.add_argument("--teacher-ckpt", default="")
    p.add_argument("--resume", default="")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    return p.parse_args()


def main():
    args = parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model)
    if args.teacher_ckpt:
        with torch.serialization.safe_globals([TrainConfig]):
            teacher = torch.load(args.teacher_ckpt, map_location="cpu")
        model.load_state_dict(teacher["model"], strict=False)

    start_epoch = 0
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if args.resume:
        ckpt = torch.load(args.resume, map_location=device)  # planted: PT008
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1
    model = DDP(model, device_ids=[local_rank])

    dataset = SummarizationDataset("data/cnn_dailymail", tokenizer, split="train")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, collate_fn=dataset.collate)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for batch in loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if dist.get_rank() == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, "t5_summ_last.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
