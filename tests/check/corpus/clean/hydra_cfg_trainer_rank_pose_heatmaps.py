import logging
import os

import hydra
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)


def init_dist(cfg: DictConfig) -> None:
    OmegaConf.set_struct(cfg, False)
    cfg.trainer.rank = int(os.environ.get("RANK", 0))
    cfg.trainer.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cfg.trainer.world_size = int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(cfg.trainer.local_rank)
    dist.init_process_group(backend=cfg.trainer.backend, rank=cfg.trainer.rank,
                            world_size=cfg.trainer.world_size)


class HeatmapNet(nn.Module):
    def __init__(self, joints: int, width: int):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        )
        self.body = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(width, width, 3, 1, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
            for _ in range(4)
        ])
        self.head = nn.Conv2d(width, joints, 1)

    def forward(self, x):
        return self.head(self.body(self.stem(x)))


def build_loader(cfg: DictConfig):
    n = cfg.data.num_samples
    images = torch.randn(n, 3, cfg.data.size, cfg.data.size)
    heat = torch.rand(n, cfg.model.joints, cfg.data.size // 4, cfg.data.size // 4)
    vis = (torch.rand(n, cfg.model.joints) > 0.2).float()
    ds = TensorDataset(images, heat, vis)
    sampler = DistributedSampler(ds, num_replicas=cfg.trainer.world_size, rank=cfg.trainer.rank,
                                 seed=cfg.seed)
    loader = DataLoader(ds, batch_size=cfg.data.batch_size, sampler=sampler,
                        num_workers=cfg.data.workers, pin_memory=True, drop_last=True)
    return loader, sampler


def joints_mse(pred, target, vis):
    per_joint = F.mse_loss(pred, target, reduction="none").mean(dim=(2, 3))
    return (per_joint * vis).sum() / vis.sum().clamp(min=1)


@hydra.main(config_path="conf", config_name="pose", version_base="1.3")
def main(cfg: DictConfig) -> None:
    init_dist(cfg)
    device = torch.device(f"cuda:{cfg.trainer.local_rank}")
    if cfg.trainer.rank == 0:
        log.info("config:\n%s", OmegaConf.to_yaml(cfg))

    loader, sampler = build_loader(cfg)
    model = HeatmapNet(cfg.model.joints, cfg.model.width)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to(device)
    model = DistributedDataParallel(model, device_ids=[cfg.trainer.local_rank])
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.wd)
    sched = torch.optim.lr_scheduler.MultiStepLR(optim, milestones=list(cfg.optim.milestones), gamma=0.1)

    for epoch in range(cfg.trainer.epochs):
        sampler.set_epoch(epoch)
        model.train()
        stats = torch.zeros(2, device=device)
        for step, (img, heat, vis) in enumerate(loader):
            img, heat, vis = img.to(device), heat.to(device), vis.to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.trainer.bf16):
                pred = model(img)
            loss = joints_mse(pred.float(), heat, vis)
            optim.zero_grad()
            loss.backward()
            optim.step()
            stats += torch.stack([loss.detach() * img.size(0), torch.tensor(float(img.size(0)), device=device)])
            if cfg.trainer.rank == 0 and step % cfg.trainer.log_every == 0:
                log.info("epoch %d step %d loss(local) %.5f", epoch, step, loss.item())
        sched.step()
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        if cfg.trainer.rank == 0:
            log.info("epoch %d mean loss %.5f", epoch, (stats[0] / stats[1]).item())
            torch.save({"epoch": epoch, "model": model.module.state_dict(),
                        "optim": optim.state_dict()}, f"pose_epoch{epoch}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
