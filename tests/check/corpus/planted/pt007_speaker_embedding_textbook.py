"""Speaker-verification embeddings (ECAPA-like TDNN with attentive pooling, AAM softmax) with DDP.

Planted: PT007 - the final model is pickled whole with torch.save(model, path)
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

N_SPEAKERS = 5994


class FbankUtterances(Dataset):
    def __len__(self):
        return 1_092_009

    def __getitem__(self, i):
        return torch.randn(80, 200), i % N_SPEAKERS


class AttentiveStatsPool(nn.Module):
    def __init__(self, ch, bottleneck=128):
        super().__init__()
        self.att = nn.Sequential(nn.Conv1d(ch, bottleneck, 1), nn.Tanh(), nn.Conv1d(bottleneck, ch, 1))

    def forward(self, x):
        w = torch.softmax(self.att(x), dim=2)
        mu = (x * w).sum(2)
        sigma = ((x ** 2) * w).sum(2) - mu ** 2
        return torch.cat([mu, sigma.clamp(min=1e-6).sqrt()], 1)


class SpeakerTDNN(nn.Module):
    def __init__(self, ch=512, emb=192):
        super().__init__()
        self.frames = nn.Sequential(
            nn.Conv1d(80, ch, 5, padding=2), nn.ReLU(), nn.BatchNorm1d(ch),
            nn.Conv1d(ch, ch, 3, dilation=2, padding=2), nn.ReLU(), nn.BatchNorm1d(ch),
            nn.Conv1d(ch, ch, 3, dilation=3, padding=3), nn.ReLU(), nn.BatchNorm1d(ch),
        )
        self.pool = AttentiveStatsPool(ch)
        self.emb = nn.Linear(2 * ch, emb)
        self.classifier = nn.Linear(emb, N_SPEAKERS, bias=False)

    def forward(self, feats):
        e = self.emb(self.pool(self.frames(feats)))
        return F.linear(F.normalize(e), F.normalize(self.classifier.weight))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=80)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--export", default="ecapa_speaker.pt")
    args = ap.parse_args()

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    model = SpeakerTDNN().to(device)
    ddp_model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.Adam(ddp_model.parameters(), lr=1e-3, weight_decay=2e-5)

    dataset = FbankUtterances()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8, drop_last=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp_model.train()
        stats = torch.zeros(2, device=device)
        for feats, spk in loader:
            feats = feats.to(device, non_blocking=True)
            spk = spk.to(device, non_blocking=True)
            cosine = ddp_model(feats)
            margin = F.one_hot(spk, N_SPEAKERS) * 0.2
            loss = F.cross_entropy(30.0 * (cosine - margin), spk)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            stats[0] += (cosine.argmax(1) == spk).sum()
            stats[1] += spk.numel()
        dist.all_reduce(stats)
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train acc {(stats[0] / stats[1]).item():.4f}")

    if dist.get_rank() == 0:
        torch.save(model, args.export)  # planted: PT007
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
