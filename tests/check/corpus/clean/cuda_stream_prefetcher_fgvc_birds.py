import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torchvision
import torchvision.transforms.v2 as T
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


class CudaPrefetcher:
    """Copies the next uint8 batch on a side stream and normalizes it there."""

    def __init__(self, loader, device):
        self.loader = loader
        self.device = device
        self.stream = torch.cuda.Stream(device=device)
        self.mean = MEAN.to(device)
        self.std = STD.to(device)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        it = iter(self.loader)
        nxt = self._preload(it)
        while nxt is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            images, labels = nxt
            images.record_stream(torch.cuda.current_stream(self.device))
            labels.record_stream(torch.cuda.current_stream(self.device))
            nxt = self._preload(it)
            yield images, labels

    def _preload(self, it):
        try:
            images, labels = next(it)
        except StopIteration:
            return None
        with torch.cuda.stream(self.stream):
            images = images.to(self.device, non_blocking=True).float()
            images = images.sub_(self.mean).div_(self.std).contiguous(memory_format=torch.channels_last)
            labels = labels.to(self.device, non_blocking=True)
        return images, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="CUB_200_2011/images")
    ap.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    ap.add_argument("--epochs", type=int, default=60)
    args = ap.parse_args()

    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    device = torch.device("cuda", args.local_rank)
    is_main = dist.get_rank() == 0

    tf = T.Compose([T.PILToTensor(), T.RandomResizedCrop(448, antialias=True), T.RandomHorizontalFlip()])
    ds = torchvision.datasets.ImageFolder(args.root, transform=tf)
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=24, sampler=sampler, num_workers=8, pin_memory=True,
                        drop_last=True, persistent_workers=True)
    prefetch = CudaPrefetcher(loader, device)

    model = torchvision.models.resnet50(weights="IMAGENET1K_V2")
    model.fc = nn.Linear(model.fc.in_features, 200)
    model = model.to(device, memory_format=torch.channels_last)
    model = DDP(model, device_ids=[args.local_rank], gradient_as_bucket_view=True)
    backbone = [p for n, p in model.named_parameters() if "fc" not in n]
    head = [p for n, p in model.named_parameters() if "fc" in n]
    opt = torch.optim.SGD([{"params": backbone, "lr": 1e-3}, {"params": head, "lr": 1e-2}],
                          momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, args.epochs)
    crit = nn.CrossEntropyLoss(label_smoothing=0.1)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        seen = torch.zeros(2, device=device)
        for images, labels in prefetch:
            logits = model(images)
            loss = crit(logits, labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen[0] += (logits.argmax(1) == labels).sum()
            seen[1] += labels.numel()
        sched.step()
        dist.all_reduce(seen)
        if is_main:
            print(f"epoch {epoch} train acc {(seen[0] / seen[1]).item():.3f}")
            torch.save(model.module.state_dict(), "cub_r50.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
