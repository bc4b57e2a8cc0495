"""Plain torchrun shape with bf16 autocast and no GradScaler; guards spelled `not dist.is_initialized() or dist.get_rank() == 0`."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def main_rank() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def log(msg):
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(msg, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="/data/cifar")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--bs", type=int, default=256)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    log(f"world size {dist.get_world_size()}")

    tfm = torchvision.transforms.ToTensor()
    train_set = torchvision.datasets.CIFAR10(args.root, train=True, transform=tfm)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=args.bs, sampler=sampler, num_workers=8, pin_memory=True,
                        persistent_workers=True)
    model = torchvision.models.resnet18(num_classes=10).to(device, memory_format=torch.channels_last)
    model = DDP(model, device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.4, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.4, epochs=args.epochs, steps_per_epoch=len(loader))

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        epoch_loss = torch.zeros(1, device=device)
        for x, y in loader:
            x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            epoch_loss += loss.detach()
        epoch_loss /= len(loader)
        dist.all_reduce(epoch_loss, op=dist.ReduceOp.AVG)
        log(f"epoch {epoch}: loss {epoch_loss.item():.4f}")
        if main_rank():
            torch.save(model.module.state_dict(), "resnet18_cifar_bf16.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
