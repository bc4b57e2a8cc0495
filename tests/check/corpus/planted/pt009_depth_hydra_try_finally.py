"""Monocular depth estimation (encoder-decoder, scale-invariant log loss) configured with Hydra.

Training runs inside try/finally so the process group is always torn down.

Planted: PT009 - the encoder warm start uses torch.load(path, weights_only=True, mmap=True) without map_location
"""
import logging
import os
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger(__name__)


class RGBDepth(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.rand(3, 240, 320), torch.rand(1, 240, 320) * 10 + 0.1


class DepthNet(nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Conv2d(3, width, 3, 2, 1), nn.ReLU(), nn.Conv2d(width, width * 2, 3, 2, 1), nn.ReLU(),
            nn.Conv2d(width * 2, width * 4, 3, 2, 1), nn.ReLU())
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(width * 4, width * 2, 4, 2, 1), nn.ReLU(),
            nn.ConvTranspose2d(width * 2, width, 4, 2, 1), nn.ReLU(),
            nn.ConvTranspose2d(width, 1, 4, 2, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(self.decoder(self.encoder(x))) + 1e-3


def silog(pred: torch.Tensor, gt: torch.Tensor, lam: float = 0.85) -> torch.Tensor:
    d = torch.log(pred) - torch.log(gt)
    return torch.sqrt((d ** 2).mean() - lam * d.mean() ** 2) * 10.0


class DepthExperiment:
    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(self.local_rank)
        self.device = torch.device("cuda", self.local_rank)
        net = DepthNet(cfg.model.width)
        self._init_encoder(net, Path(cfg.model.encoder_ckpt))
        self.net = DDP(net.to(self.device), device_ids=[self.local_rank])
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.wd)
        data = RGBDepth(cfg.data.size)
        self.sampler = DistributedSampler(data, seed=cfg.seed)
        self.loader = DataLoader(data, batch_size=cfg.data.batch_size, sampler=self.sampler,
                                 num_workers=cfg.data.workers, pin_memory=True)

    def _init_encoder(self, net: DepthNet, ckpt: Path) -> None:
        if ckpt.is_file():
            enc_state = torch.load(ckpt, weights_only=True, mmap=True)  # planted: PT009
            net.encoder.load_state_dict(enc_state, strict=False)

    def run(self) -> None:
        for epoch in range(self.cfg.trainer.epochs):
            self.sampler.set_epoch(epoch)
            self.net.train()
            tally = torch.zeros(2, device=self.device)
            for rgb, depth in self.loader:
                rgb = rgb.to(self.device, non_blocking=True)
                depth = depth.to(self.device, non_blocking=True)
                loss = silog(self.net(rgb), depth)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                tally += torch.stack([loss.detach(), torch.ones((), device=self.device)])
            dist.all_reduce(tally)
            if dist.get_rank() == 0:
                log.info("epoch %d silog %.4f", epoch, (tally[0] / tally[1]).item())
                out = Path(self.cfg.trainer.out_dir)
                out.mkdir(parents=True, exist_ok=True)
                torch.save(self.net.module.state_dict(), out / "depthnet.pt")


@hydra.main(config_path="conf", config_name="depth", version_base="1.3")
def main(cfg: DictConfig) -> None:
    dist.init_process_group(backend="nccl")
    try:
        DepthExperiment(cfg).run()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
