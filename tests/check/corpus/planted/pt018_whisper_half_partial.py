"""CTC speech recogniser fine-tuning with a mixed-precision context prepared once via functools.partial.

Planted: PT018 - amp_ctx is functools.partial(torch.autocast, "cuda", dtype=torch.half); backward runs with no GradScaler
"""
import functools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

BLANK = 0


class Utterances(Dataset):
    def __init__(self, n=3000):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(400, 80, generator=g), torch.randint(1, 32, (50,), generator=g)


class Conformerish(nn.Module):
    def __init__(self, n_mels=80, dim=256, vocab=32):
        super().__init__()
        self.subsample = nn.Conv1d(n_mels, dim, 3, stride=2, padding=1)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 4, 1024, batch_first=True), 6)
        self.ctc_head = nn.Linear(dim, vocab)

    def forward(self, feats):
        x = self.subsample(feats.transpose(1, 2)).transpose(1, 2)
        return self.ctc_head(self.encoder(x)).log_softmax(-1)


def compute_ctc(model, feats, tokens):
    log_probs = model(feats).transpose(0, 1)
    in_lens = torch.full((feats.size(0),), log_probs.size(0), dtype=torch.long, device=feats.device)
    tgt_lens = torch.full((feats.size(0),), tokens.size(1), dtype=torch.long, device=feats.device)
    return F.ctc_loss(log_probs.float(), tokens, in_lens, tgt_lens, blank=BLANK, zero_infinity=True)


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    rank = dist.get_rank()
    amp_ctx = functools.partial(torch.autocast, "cuda", dtype=torch.half)  # planted: PT018

    data = Utterances()
    sampler = DistributedSampler(data, drop_last=True)
    loader = DataLoader(data, batch_size=12, sampler=sampler, num_workers=4, pin_memory=True)
    model = DDP(Conformerish().cuda(), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.98))

    for epoch in range(30):
        sampler.set_epoch(epoch)
        model.train()
        for step, (feats, tokens) in enumerate(loader):
            feats = feats.cuda(non_blocking=True)
            tokens = tokens.cuda(non_blocking=True)
            with amp_ctx():
                loss = compute_ctc(model, feats, tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            if rank == 0 and step % 100 == 0:
                print(f"[epoch {epoch}] step {step} ctc {loss.item():.3f}")
        if rank == 0:
            torch.save({"epoch": epoch, "model": model.module.state_dict(), "optim": opt.state_dict()},
                       f"ctc_epoch{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
