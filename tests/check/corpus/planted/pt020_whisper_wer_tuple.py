"""Speech recognition fine-tuning; validation returns a (wer, loss) tuple computed over the rank's loader.

Planted: PT020 - rank 0 prints the word error rate (errors / words) of its own DistributedSampler shard only
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Speech(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.feats = torch.randn(n, 200, 80, generator=g)
        self.words = torch.randint(1, 1000, (n, 20), generator=g)

    def __len__(self):
        return len(self.feats)

    def __getitem__(self, i):
        return self.feats[i], self.words[i]


class FrameToWord(nn.Module):
    def __init__(self, vocab=1000, dim=256):
        super().__init__()
        self.enc = nn.GRU(80, dim, num_layers=2, batch_first=True)
        self.pool = nn.AdaptiveAvgPool1d(20)
        self.out = nn.Linear(dim, vocab)

    def forward(self, feats):
        h, _ = self.enc(feats)
        return self.out(self.pool(h.transpose(1, 2)).transpose(1, 2))


def validate(model, loader, device):
    model.eval()
    errors = words = 0
    loss_sum, batches = 0.0, 0
    with torch.inference_mode():
        for feats, ref in loader:
            feats, ref = feats.to(device), ref.to(device)
            logits = model(feats)
            loss_sum += F.cross_entropy(logits.transpose(1, 2), ref).item()
            batches += 1
            errors += (logits.argmax(-1) != ref).sum().item()
            words += ref.numel()
    return errors / words, loss_sum / batches


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    train_ds, dev_ds = Speech(6000, 0), Speech(800, 1)
    train_sampler = DistributedSampler(train_ds)
    train_loader = DataLoader(train_ds, batch_size=32, sampler=train_sampler)
    dev_loader = DataLoader(dev_ds, batch_size=32, sampler=DistributedSampler(dev_ds, shuffle=False))

    model = DDP(FrameToWord().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(20):
        train_sampler.set_epoch(epoch)
        model.train()
        for feats, ref in train_loader:
            feats, ref = feats.to(device), ref.to(device)
            loss = F.cross_entropy(model(feats).transpose(1, 2), ref)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        wer, dev_loss = validate(model, dev_loader, device)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: dev WER {wer:.2%} dev loss {dev_loss:.3f}")  # planted: PT020
            torch.save(model.module.state_dict(), "asr_latest.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
