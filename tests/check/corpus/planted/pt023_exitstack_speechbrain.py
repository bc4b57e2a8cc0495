"""Brain-style trainer (fit_batch / fit) where contexts for a batch are composed with contextlib.ExitStack.

Planted: PT023 - fit_batch() always enters self.modules.no_sync() on the ExitStack before backward, so DDP never syncs gradients
"""
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Brain:
    def __init__(self, modules, opt_class, hparams, device):
        self.modules = modules
        self.optimizer = opt_class(self.modules.parameters())
        self.hparams = hparams
        self.device = device
        self.step = 0

    def compute_forward(self, batch):
        wavs, _ = batch
        return self.modules(wavs.to(self.device))

    def compute_objectives(self, predictions, batch):
        _, labels = batch
        return F.cross_entropy(predictions, labels.to(self.device))

    def fit_batch(self, batch):
        with contextlib.ExitStack() as stack:
            if self.hparams["bf16"]:
                stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
            stack.enter_context(self.modules.no_sync())  # planted: PT023
            predictions = self.compute_forward(batch)
            loss = self.compute_objectives(predictions, batch)
            loss.backward()
        nn.utils.clip_grad_norm_(self.modules.parameters(), self.hparams["max_grad_norm"])
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.step += 1
        return loss.detach()

    def fit(self, epoch_counter, train_loader):
        for epoch in epoch_counter:
            train_loader.sampler.set_epoch(epoch)
            self.modules.train()
            for batch in train_loader:
                loss = self.fit_batch(batch)
                if dist.get_rank() == 0 and self.step % 100 == 0:
                    print(f"epoch {epoch} step {self.step} train loss {loss.item():.3f}")
            if dist.get_rank() == 0:
                torch.save(self.modules.module.state_dict(), os.path.join(self.hparams["save_folder"], "CKPT.pt"))


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = f"cuda:{local_rank}"
    hparams = {"bf16": True, "max_grad_norm": 5.0, "save_folder": "results/keyword_spotting"}

    wavs = torch.randn(8000, 1, 16000)
    labels = torch.randint(0, 12, (8000,))
    dataset = TensorDataset(wavs, labels)
    train_loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset), num_workers=4)

    net = nn.Sequential(nn.Conv1d(1, 64, 400, 160), nn.ReLU(), nn.Conv1d(64, 128, 3, 2), nn.ReLU(),
                        nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(128, 12))
    modules = DDP(net.to(device), device_ids=[local_rank])
    brain = Brain(modules, lambda p: torch.optim.Adam(p, lr=1e-3), hparams, device)
    brain.fit(range(1, 31), train_loader)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
