"""GPT pretraining loop in the style of an iteration-based pretrain_gpt.py."""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as torch_dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as torchDDP
from torch.utils.data import DataLoader, Dataset


def print_rank_0(message):
    if torch_dist.is_initialized():
        if torch_dist.get_rank() == 0:
            print(message, flush=True)
    else:
        print(message, flush=True)


def print_rank_last(message):
    if torch_dist.is_initialized():
        if torch_dist.get_rank() == torch_dist.get_world_size() - 1:
            print(message, flush=True)
    else:
        print(message, flush=True)


class PretrainingSampler:
    """Deterministic batch sampler: each data-parallel rank takes its slice of the global batch."""

    def __init__(self, total_samples, consumed_samples, micro_batch_size, dp_rank, dp_size):
        self.total, self.consumed = total_samples, consumed_samples
        self.mbs, self.dp_rank, self.dp_size = micro_batch_size, dp_rank, dp_size

    def __len__(self):
        return self.total

    def __iter__(self):
        batch = []
        global_mb = self.mbs * self.dp_size
        for idx in range(self.consumed, self.total):
            batch.append(idx)
            if len(batch) == global_mb:
                start = self.dp_rank * self.mbs
                yield batch[start:start + self.mbs]
                batch = []


class IndexedTokens(Dataset):
    def __init__(self, n, seq_len):
        self.n, self.seq_len = n, seq_len

    def __len__(self):
        return self.n

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        return {"text": torch.randint(0, 50304, (self.seq_len + 1,), generator=g)}


def average_losses_across_data_parallel_group(losses):
    averaged = torch.cat([loss.clone().detach().view(1) for loss in losses])
    torch_dist.all_reduce(averaged)
    return averaged / torch_dist.get_world_size()


def get_batch(data_iterator):
    data = next(data_iterator)
    tokens_ = data["text"].long().cuda(non_blocking=True)
    return tokens_[:, :-1].contiguous(), tokens_[:, 1:].contiguous()


def save_checkpoint(iteration, model, optimizer, args):
    if torch_dist.get_rank() == 0:
        path = os.path.join(args.save, f"iter_{iteration:07d}", "mp_rank_00", "model_optim_rng.pt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        unwrapped = model.module if isinstance(model, torchDDP) else model
        torch.save({"iteration": iteration, "model": unwrapped.state_dict(),
                    "optimizer": optimizer.state_dict(), "rng": torch.cuda.get_rng_state()}, path)
        with open(os.path.join(args.save, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))
    torch_dist.barrier()
    print_rank_0(f"  successfully saved checkpoint at iteration {iteration:7d} to {args.save}")


def pretrain(args):
    torch.cuda.set_device(args.local_rank)
    torch_dist.init_process_group(backend="nccl", timeout=datetime.timedelta(minutes=10))
    dp_rank, dp_size = torch_dist.get_rank(), torch_dist.get_world_size()
    print_rank_0(f"> initialized data parallel with size {dp_size}")

    layer = nn.TransformerEncoderLayer(args.hidden, args.heads, 4 * args.hidden, batch_first=True)
    model = nn.Sequential(nn.Embedding(50304, args.hidden), nn.TransformerEncoder(layer, args.layers),
                          nn.Linear(args.hidden, 50304)).cuda(torch.cuda.current_device())
    model = torchDDP(model, device_ids=[args.local_rank], output_device=args.local_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.train_iters)

    total = args.train_iters * args.micro_batch_size * dp_size
    sampler = PretrainingSampler(total, 0, args.micro_batch_size, dp_rank, dp_size)
    data_iterator = iter(DataLoader(IndexedTokens(total, args.seq_length), batch_sampler=sampler, num_workers=2))

    iteration, t0 = 0, time.time()
    while iteration < args.train_iters:
        tokens, labels = get_batch(data_iterator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens)
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), labels.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        iteration += 1
        reduced = average_losses_across_data_parallel_group([loss])
        if iteration % args.log_interval == 0:
            elapsed = (time.time() - t0) * 1000.0 / args.log_interval
            print_rank_last(f" iteration {iteration:8d}/{args.train_iters:8d} | elapsed per iter (ms): {elapsed:.1f} "
                            f"| lm loss: {reduced[0].item():.6E} | lr: {scheduler.get_last_lr()[0]:.3E}")
            t0 = time.time()
        if iteration % args.save_interval == 0:
            save_checkpoint(iteration, model, optimizer, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int,
                        default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--train-iters", type=int, default=10000)
    parser.add_argument("--lr", type=float, default=1.5e-4)
    parser.add_argument("--log-interval", type=int, default=100)
    parser.add_argument("--save-interval", type=int, default=1000)
    parser.add_argument("--save", default="checkpoints/gpt")
    pretrain(parser.parse_args())
