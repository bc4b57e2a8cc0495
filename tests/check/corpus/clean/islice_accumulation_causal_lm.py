"""Causal LM training where each optimizer step consumes `accum` micro-batches via itertools.islice."""
import itertools
import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import AutoConfig, AutoModelForCausalLM


class TokenBlocks(Dataset):
    def __init__(self, n_blocks=50_000, block=512, vocab=50257):
        self.n, self.block, self.vocab = n_blocks, block, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, self.vocab, (self.block,), generator=g)


def cosine_lr(step, total, warmup, peak):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.1 * peak + 0.45 * peak * (1 + math.cos(math.pi * progress))


def main():
    accum, micro_bs, epochs, peak_lr = 8, 8, 2, 6e-4
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank)

    config = AutoConfig.from_pretrained("gpt2")
    model = DDP(AutoModelForCausalLM.from_config(config).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)

    data = TokenBlocks()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1337)
    loader = DataLoader(data, batch_size=micro_bs, sampler=sampler, num_workers=4, pin_memory=True, drop_last=True)
    steps_per_epoch = len(loader) // accum
    total_steps = epochs * steps_per_epoch

    step = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for _ in range(steps_per_epoch):
            for group in optimizer.param_groups:
                group["lr"] = cosine_lr(step, total_steps, 200, peak_lr)
            window_loss = torch.zeros((), device=device)
            for micro_idx, tokens in enumerate(itertools.islice(batches, accum)):
                tokens = tokens.to(device, non_blocking=True)
                last = micro_idx == accum - 1
                with model.no_sync() if not last else nullcontext():
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        logits = model(input_ids=tokens).logits
                    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())
                    (loss / accum).backward()
                window_loss += loss.detach() / accum
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step % 20 == 0:
                dist.all_reduce(window_loss, op=dist.ReduceOp.AVG)
                if rank == 0:
                    print(f"epoch {epoch} step {step}/{total_steps} loss {window_loss.item():.4f} ppl {math.exp(window_loss.item()):.1f}")
        if rank == 0:
            model.module.save_pretrained(f"ckpt/epoch{epoch}")
            torch.save(optimizer.state_dict(), f"ckpt/epoch{epoch}/optimizer.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
