"""Image-text matching fine-tuning with a runner/task split; evaluation returns a metrics dict.

Planted: PT020 - the main process logs metrics["agg_metrics"] (correct / total on its own val shard) with no reduction anywhere
"""
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def is_dist_avail_and_initialized():
    return dist.is_available() and dist.is_initialized()


def is_main_process():
    return not is_dist_avail_and_initialized() or dist.get_rank() == 0


class ITMPairs(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.img = torch.randn(n, 512, generator=g)
        self.txt = torch.randn(n, 512, generator=g)
        self.label = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return {"image": self.img[i], "text_input": self.txt[i], "label": self.label[i]}


class ITMHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.fuse = nn.Sequential(nn.Linear(1024, 512), nn.GELU(), nn.Linear(512, 2))

    def forward(self, samples):
        return self.fuse(torch.cat([samples["image"], samples["text_input"]], dim=-1))


class RetrievalTask:
    def train_step(self, model, samples):
        return F.cross_entropy(model(samples), samples["label"])

    @torch.no_grad()
    def evaluation(self, model, data_loader, device):
        model.eval()
        correct, total, loss_sum = 0, 0, 0.0
        for samples in data_loader:
            samples = {k: v.to(device) for k, v in samples.items()}
            logits = model(samples)
            loss_sum += F.cross_entropy(logits, samples["label"], reduction="sum").item()
            correct += (logits.argmax(-1) == samples["label"]).sum().item()
            total += samples["label"].numel()
        return {"agg_metrics": correct / total, "loss": loss_sum / total}


def main():
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    dist.init_process_group(backend="nccl", init_method="env://")
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)
    device = torch.device("cuda", gpu)

    train_ds, val_ds = ITMPairs(20000, 0), ITMPairs(4000, 1)
    train_sampler = DistributedSampler(train_ds, shuffle=True)
    val_sampler = DistributedSampler(val_ds, shuffle=False)
    train_loader = DataLoader(train_ds, batch_size=256, sampler=train_sampler, num_workers=2)
    val_loader = DataLoader(val_ds, batch_size=256, sampler=val_sampler, num_workers=2)

    task = RetrievalTask()
    model = DDP(ITMHead().to(device), device_ids=[gpu])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)

    for cur_epoch in range(10):
        train_sampler.set_epoch(cur_epoch)
        model.train()
        for samples in train_loader:
            samples = {k: v.to(device, non_blocking=True) for k, v in samples.items()}
            loss = task.train_step(model, samples)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        val_log = task.evaluation(model, val_loader, device)
        if is_main_process():
            logging.info("Epoch %d val agg_metrics=%.4f", cur_epoch, val_log["agg_metrics"])  # planted: PT020
            torch.save({"model": model.module.state_dict(), "epoch": cur_epoch}, "output/checkpoint_latest.pth")


if __name__ == "__main__":
    main()
