"""One epoch of mixed-precision DDP training, using the project's loss-scaling helper."""

from __future__ import annotations

import torch
import torch.distributed as dist

from amp_utils import LossScaler


def train_one_epoch(model, loader, optimizer, scaler: LossScaler, device, accum_iter: int = 1):
    model.train()
    for step, (images, targets) in enumerate(loader):
        images, targets = images.to(device, non_blocking=True), targets.to(device)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(images), targets) / accum_iter
        scaler(loss, optimizer, clip_grad=1.0, parameters=model.parameters(),
               update_grad=(step + 1) % accum_iter == 0)
        if (step + 1) % accum_iter == 0:
            optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"last loss {loss.item():.4f}")


def evaluate_in_fp32(model, loader, device):
    """Metrics in full precision: autocast switched off explicitly."""
    model.eval()
    correct = torch.zeros((), device=device)
    with torch.no_grad(), torch.autocast("cuda", enabled=False):
        for images, targets in loader:
            correct += (model(images.to(device)).argmax(1) == targets.to(device)).sum()
    dist.all_reduce(correct)
    return correct.item()
