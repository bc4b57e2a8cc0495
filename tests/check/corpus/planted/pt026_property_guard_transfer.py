"""Two-stage pipeline: masked-feature pretraining of a 1-D CNN on ECG signals, then arrhythmia fine-tuning.

Planted: PT026 - finetune() makes every rank import the backbone file that only the is_main property branch just exported; no barrier
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

log = logging.getLogger("ecg")


def backbone() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv1d(12, 64, 15, padding=7), nn.BatchNorm1d(64), nn.ReLU(),
        nn.Conv1d(64, 128, 9, stride=2, padding=4), nn.BatchNorm1d(128), nn.ReLU(),
        nn.Conv1d(128, 256, 9, stride=2, padding=4), nn.BatchNorm1d(256), nn.ReLU(),
    )


class Pipeline:
    def __init__(self, pretrain_set, finetune_set, workdir: Path) -> None:
        self.rank = dist.get_rank()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.pretrain_set, self.finetune_set = pretrain_set, finetune_set
        self.backbone_path = workdir / "ecg_backbone.pt"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _loader(self, dataset, batch_size: int) -> tuple[DataLoader, DistributedSampler]:
        sampler = DistributedSampler(dataset)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=4), sampler

    def _export_backbone(self, net: nn.Module) -> None:
        self.backbone_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(net.state_dict(), self.backbone_path)

    def _import_backbone(self, net: nn.Module) -> None:
        net.load_state_dict(torch.load(self.backbone_path, map_location=self.device, weights_only=True))

    def pretrain(self, epochs: int = 50) -> None:
        enc = backbone()
        model = DDP(nn.Sequential(enc, nn.ConvTranspose1d(256, 12, 4, stride=4)).to(self.device), device_ids=[self.local_rank])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader, sampler = self._loader(self.pretrain_set, 128)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for sig in loader:
                sig = sig.to(self.device, non_blocking=True)
                mask = (torch.rand(sig.size(0), 1, sig.size(2), device=self.device) < 0.3).float()
                recon = model(sig * (1 - mask))
                loss = (F.mse_loss(recon, sig, reduction="none") * mask).sum() / mask.sum().clamp(min=1)
                opt.zero_grad()
                loss.backward()
                opt.step()
        if self.is_main:
            self._export_backbone(model.module[0])

    def finetune(self, epochs: int = 30, n_classes: int = 5) -> None:
        enc = backbone()
        self._import_backbone(enc)  # planted: PT026
        head = nn.Sequential(nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(256, n_classes))
        model = DDP(nn.Sequential(enc, head).to(self.device), device_ids=[self.local_rank])
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        loader, sampler = self._loader(self.finetune_set, 64)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for sig, label in loader:
                sig, label = sig.to(self.device), label.to(self.device)
                loss = F.cross_entropy(model(sig), label)
                opt.zero_grad()
                loss.backward()
                opt.step()
        if self.is_main:
            torch.save(model.module.state_dict(), self.backbone_path.with_name("ecg_classifier.pt"))


def main() -> None:
    from ptbxl import PTBXLSignals, PTBXLLabels

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    pipe = Pipeline(PTBXLSignals("ptb-xl"), PTBXLLabels("ptb-xl", task="superdiagnostic"), Path("runs/ecg"))
    pipe.pretrain()
    pipe.finetune()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
