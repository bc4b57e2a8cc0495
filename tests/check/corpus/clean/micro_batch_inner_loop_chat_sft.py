import math
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

IGNORE = -100
TOTAL_STEPS, WARMUP, ACCUM, MICRO_BS = 3000, 100, 8, 4


class ChatTurns(Dataset):
    """Prompt tokens are masked out of the labels; only the reply is supervised."""

    def __len__(self):
        return 120_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(3, 32_000, (512,), generator=g)
        labels = ids.clone()
        labels[: int(torch.randint(64, 384, (1,), generator=g))] = IGNORE
        return ids, labels


class TinyDecoder(nn.Module):
    def __init__(self, vocab=32_000, d=1024, layers=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        block = nn.TransformerEncoderLayer(d, 16, 4 * d, 0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.size(1), device=ids.device)
        return self.head(self.blocks(self.emb(ids), mask=mask, is_causal=True))


def forever(loader):
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def warmup_cosine(step):
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (TOTAL_STEPS - WARMUP)))


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    lead = dist.get_rank() == 0

    ds = ChatTurns()
    loader = DataLoader(ds, batch_size=MICRO_BS, sampler=DistributedSampler(ds, seed=11),
                        num_workers=4, pin_memory=True, drop_last=True)
    batches = forever(loader)
    base = TinyDecoder().to(device)
    base.load_state_dict(torch.load("pretrained_decoder.pt", map_location=device, weights_only=True))
    model = DDP(base, device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    scaler = torch.amp.GradScaler("cuda")

    for step in range(TOTAL_STEPS):
        tokens_seen = torch.zeros(2, device=device)
        for micro in range(ACCUM):
            ids, labels = next(batches)
            ids, labels = ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            sync_now = micro == ACCUM - 1
            ctx = nullcontext() if sync_now else model.no_sync()
            with ctx:
                with torch.autocast("cuda", dtype=torch.float16):
                    logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE)
                scaler.scale(loss / ACCUM).backward()
            tokens_seen += torch.stack([loss.detach() * (labels[:, 1:] != IGNORE).sum(),
                                        (labels[:, 1:] != IGNORE).sum().float()])
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)

        if step % 20 == 0:
            dist.all_reduce(tokens_seen)
            if lead:
                print(f"step {step:5d} loss/token {(tokens_seen[0] / tokens_seen[1]).item():.4f} "
                      f"lr {sched.get_last_lr()[0]:.2e}")
        if (step + 1) % 500 == 0 and lead:
            torch.save(base.state_dict(), f"sft_step{step + 1}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
