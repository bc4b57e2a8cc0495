import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchaudio
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

N_TAGS = 527


class Clips(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(160_000, generator=g) * 0.1, (torch.rand(N_TAGS, generator=g) < 0.01).float()


class MultiLabelStats:
    """Accumulates per-tag TP/FP/FN and loss; sync() sums them over ranks."""

    def __init__(self, n_tags, device, threshold=0.5):
        self.device, self.threshold = device, threshold
        self.tp = torch.zeros(n_tags, device=device)
        self.fp = torch.zeros(n_tags, device=device)
        self.fn = torch.zeros(n_tags, device=device)
        self.loss_sum = torch.zeros((), device=device)
        self.count = torch.zeros((), device=device)
        self._synced = False

    def update(self, logits, target, loss):
        pred = (logits.sigmoid() > self.threshold).float()
        self.tp += (pred * target).sum(0)
        self.fp += (pred * (1 - target)).sum(0)
        self.fn += ((1 - pred) * target).sum(0)
        self.loss_sum += loss.detach() * target.size(0)
        self.count += target.size(0)

    def sync(self):
        if dist.is_available() and dist.is_initialized() and not self._synced:
            for t in (self.tp, self.fp, self.fn, self.loss_sum, self.count):
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
        self._synced = True
        return self

    def compute(self):
        precision = self.tp / (self.tp + self.fp).clamp(min=1)
        recall = self.tp / (self.tp + self.fn).clamp(min=1)
        f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-8)
        return {"loss": (self.loss_sum / self.count).item(), "macro_f1": f1.mean().item(),
                "micro_f1": (2 * self.tp.sum() / (2 * self.tp.sum() + self.fp.sum() + self.fn.sum())).item()}


class CNN14Lite(nn.Module):
    def __init__(self):
        super().__init__()
        self.mel = torchaudio.transforms.MelSpectrogram(32_000, n_fft=1024, hop_length=320, n_mels=64)
        chans = [1, 64, 128, 256, 512]
        self.convs = nn.ModuleList(
            nn.Sequential(nn.Conv2d(a, b, 3, padding=1), nn.BatchNorm2d(b), nn.ReLU(), nn.AvgPool2d(2))
            for a, b in zip(chans, chans[1:]))
        self.fc = nn.Linear(512, N_TAGS)

    def forward(self, wav):
        x = torch.log(self.mel(wav) + 1e-6).unsqueeze(1)
        for conv in self.convs:
            x = conv(x)
        return self.fc(x.mean(3).amax(2))


def main():
    dist.init_process_group("nccl")
    lr_ = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(lr_)
    device = torch.device("cuda", lr_)

    train, val = Clips(20_000), Clips(2_000)
    sampler = DistributedSampler(train)
    train_dl = DataLoader(train, batch_size=32, sampler=sampler, num_workers=6)
    val_dl = DataLoader(val, batch_size=64, sampler=DistributedSampler(val, shuffle=False))
    model = DDP(CNN14Lite().to(device), device_ids=[lr_])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(30):
        sampler.set_epoch(epoch)
        model.train()
        train_stats = MultiLabelStats(N_TAGS, device)
        for wav, tags in train_dl:
            wav, tags = wav.to(device), tags.to(device)
            logits = model(wav)
            loss = F.binary_cross_entropy_with_logits(logits, tags)
            opt.zero_grad()
            loss.backward()
            opt.step()
            train_stats.update(logits.detach(), tags, loss)

        model.eval()
        val_stats = MultiLabelStats(N_TAGS, device)
        with torch.no_grad():
            for wav, tags in val_dl:
                wav, tags = wav.to(device), tags.to(device)
                logits = model(wav)
                val_stats.update(logits, tags, F.binary_cross_entropy_with_logits(logits, tags))
        tr = train_stats.sync().compute()
        va = val_stats.sync().compute()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} train loss {tr['loss']:.4f} | val loss {va['loss']:.4f} "
                  f"macro-F1 {va['macro_f1']:.3f} micro-F1 {va['micro_f1']:.3f}")
            torch.save(model.module.state_dict(), "audio_tagger.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
