"""NVIDIA BERT run_pretraining shape: args.local_rank in [-1, 0] guards, is_main_process helper, accumulation with no_sync off the boundary."""
import argparse
import os
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

from modeling import BertForPreTraining, BertConfig
from pretrain_data import PretrainingDataset


def get_rank():
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main_process():
    return get_rank() == 0


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--input_dir", required=True)
    p.add_argument("--config_file", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--train_batch_size", type=int, default=4096)
    p.add_argument("--gradient_accumulation_steps", type=int, default=64)
    p.add_argument("--max_steps", type=int, default=7038)
    p.add_argument("--num_steps_per_checkpoint", type=int, default=200)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    return p.parse_args()


def main():
    args = parse_args()
    if args.local_rank == -1:
        device = torch.device("cuda")
    else:
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
        dist.init_process_group(backend="nccl", init_method="env://")
    micro_batch = args.train_batch_size // args.gradient_accumulation_steps
    model = BertForPreTraining(BertConfig.from_json_file(args.config_file)).to(device)
    if args.local_rank != -1:
        model = DDP(model, device_ids=[args.local_rank], output_device=args.local_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-3, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 2000))
    if args.local_rank in [-1, 0]:
        os.makedirs(args.output_dir, exist_ok=True)

    dataset = PretrainingDataset(os.path.join(args.input_dir, "shard_0.hdf5"), max_pred_length=80)
    sampler = RandomSampler(dataset) if args.local_rank == -1 else DistributedSampler(dataset)
    loader = DataLoader(dataset, sampler=sampler, batch_size=micro_batch, num_workers=4, pin_memory=True)

    global_step, epoch, t0 = 0, 0, time.time()
    model.train()
    while global_step < args.max_steps:
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        for step, batch in enumerate(loader):
            batch = [t.to(device) for t in batch]
            input_ids, segment_ids, input_mask, masked_lm_labels, nsp_labels = batch
            boundary = (step + 1) % args.gradient_accumulation_steps == 0
            ctx = model.no_sync() if (args.local_rank != -1 and not boundary) else nullcontext()
            with ctx:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(input_ids, segment_ids, input_mask, masked_lm_labels, nsp_labels)
                loss = loss / args.gradient_accumulation_steps
                loss.backward()
            if boundary:
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                global_step += 1
                if global_step % 10 == 0 and is_main_process():
                    print(f"step {global_step}: loss {loss.item() * args.gradient_accumulation_steps:.4f} "
                          f"({time.time() - t0:.1f}s)")
                if global_step % args.num_steps_per_checkpoint == 0 and args.local_rank in [-1, 0]:
                    to_save = model.module if hasattr(model, "module") else model
                    torch.save({"model": to_save.state_dict(), "optimizer": optimizer.state_dict(),
                                "global_step": global_step},
                               os.path.join(args.output_dir, f"ckpt_{global_step}.pt"))
                if global_step >= args.max_steps:
                    break
        epoch += 1
    if args.local_rank != -1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
