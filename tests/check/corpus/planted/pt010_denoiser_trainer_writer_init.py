"""Speech enhancement (spectral-mask denoiser) trainer class with TensorBoard logging, DDP.

torchrun --nproc_per_node=4 train_denoiser.py --exp-dir exp/denoiser
Planted: PT010 - SummaryWriter created in Trainer.__init__ on every rank (only add_scalar calls are guarded)
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter

logger = logging.getLogger("denoiser")


class NoisyPairs(Dataset):
    def __init__(self, n=6000, n_fft=512, frames=128):
        self.n, self.bins, self.frames = n, n_fft // 2 + 1, frames

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        clean = torch.rand(self.bins, self.frames)
        noisy = clean + 0.3 * torch.rand(self.bins, self.frames)
        return noisy, clean


class MaskNet(nn.Module):
    def __init__(self, bins=257, hidden=384):
        super().__init__()
        self.rnn = nn.GRU(bins, hidden, num_layers=2, batch_first=True)
        self.mask = nn.Linear(hidden, bins)

    def forward(self, noisy):
        h, _ = self.rnn(noisy.transpose(1, 2))
        return torch.sigmoid(self.mask(h)).transpose(1, 2) * noisy


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(MaskNet().to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        dataset = NoisyPairs()
        self.sampler = DistributedSampler(dataset)
        self.loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=self.sampler, num_workers=4)
        self.writer = SummaryWriter(log_dir=os.path.join(cfg.exp_dir, "tensorboard"))  # planted: PT010
        self.global_step = 0

    def _run_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        self.model.train()
        for noisy, clean in self.loader:
            noisy = noisy.to(self.device, non_blocking=True)
            clean = clean.to(self.device, non_blocking=True)
            loss = F.l1_loss(self.model(noisy), clean)
            self.optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
            self.optimizer.step()
            self.global_step += 1
            if self.rank == 0 and self.global_step % 20 == 0:
                self.writer.add_scalar("train/l1", loss.item(), self.global_step)

    def _save(self, epoch):
        if self.rank == 0:
            os.makedirs(self.cfg.exp_dir, exist_ok=True)
            torch.save({"model": self.model.module.state_dict(), "epoch": epoch},
                       os.path.join(self.cfg.exp_dir, "checkpoint.th"))

    def train(self):
        for epoch in range(self.cfg.epochs):
            self._run_epoch(epoch)
            self._save(epoch)
            if self.rank == 0:
                logger.info("finished epoch %d (step %d)", epoch, self.global_step)
        if self.rank == 0:
            self.writer.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--exp-dir", default="exp/denoiser")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    cfg = parser.parse_args()
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    Trainer(cfg).train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
