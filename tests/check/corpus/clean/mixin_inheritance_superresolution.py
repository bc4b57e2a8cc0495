import abc
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class DistributedMixin:
    def init_distributed(self):
        dist.init_process_group("nccl")
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)

    @property
    def world_size(self):
        return dist.get_world_size()

    @property
    def is_rank_zero(self):
        return dist.get_rank() == 0

    def wrap(self, module):
        return DDP(module.to(self.device), device_ids=[self.local_rank])

    def reduce_sum(self, *vals):
        t = torch.stack([torch.as_tensor(v, dtype=torch.float32, device=self.device) for v in vals])
        dist.all_reduce(t)
        return t


class BaseTrainer(abc.ABC):
    epochs = 100

    @abc.abstractmethod
    def build(self): ...

    @abc.abstractmethod
    def train_step(self, batch) -> torch.Tensor: ...

    @abc.abstractmethod
    def on_epoch_end(self, epoch, stats): ...

    def fit(self):
        self.build()
        for epoch in range(self.epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            loss_sum, n = 0.0, 0
            for batch in self.loader:
                loss_sum += self.train_step(batch).item()
                n += 1
            self.on_epoch_end(epoch, {"loss_sum": loss_sum, "batches": n})


class Patches(Dataset):
    def __len__(self):
        return 32_000

    def __getitem__(self, i):
        hr = torch.rand(3, 96, 96, generator=torch.Generator().manual_seed(i))
        lr = F.interpolate(hr[None], scale_factor=0.25, mode="bicubic", align_corners=False)[0]
        return lr.clamp(0, 1), hr


class ESPCN(nn.Module):
    def __init__(self, scale=4, feats=64):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, feats, 5, padding=2), nn.Tanh(),
                                  nn.Conv2d(feats, feats // 2, 3, padding=1), nn.Tanh(),
                                  nn.Conv2d(feats // 2, 3 * scale ** 2, 3, padding=1))
        self.shuffle = nn.PixelShuffle(scale)

    def forward(self, x):
        return self.shuffle(self.body(x)).sigmoid()


class SRTrainer(DistributedMixin, BaseTrainer):
    epochs = 80

    def build(self):
        self.init_distributed()
        ds = Patches()
        self.sampler = DistributedSampler(ds)
        self.loader = DataLoader(ds, batch_size=64, sampler=self.sampler, num_workers=4, pin_memory=True)
        self.net = ESPCN()
        self.model = self.wrap(self.net)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.sched = torch.optim.lr_scheduler.MultiStepLR(self.opt, [30, 60], 0.1)

    def train_step(self, batch):
        lr_img, hr_img = (t.to(self.device, non_blocking=True) for t in batch)
        loss = F.l1_loss(self.model(lr_img), hr_img)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.detach()

    def on_epoch_end(self, epoch, stats):
        self.sched.step()
        total = self.reduce_sum(stats["loss_sum"], stats["batches"])
        if self.is_rank_zero:
            print(f"epoch {epoch}: L1 {(total[0] / total[1]).item():.5f} on {self.world_size} GPUs")
            torch.save({"epoch": epoch, "espcn": self.net.state_dict()}, "espcn_x4.pt")


if __name__ == "__main__":
    trainer = SRTrainer()
    try:
        trainer.fit()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
