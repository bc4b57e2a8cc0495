"""Stochastic weight averaging on top of DDP + SyncBatchNorm, BN statistics recomputed at the end."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.swa_utils import SWALR, AveragedModel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def wide_cnn(k=10):
    return nn.Sequential(
        nn.Conv2d(3, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.Conv2d(128, 256, 3, padding=1, stride=2), nn.BatchNorm2d(256), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1, stride=2), nn.BatchNorm2d(256), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, k))


@torch.no_grad()
def recompute_bn(swa_model, loader, device):
    """Like swa_utils.update_bn, but every rank runs it so SyncBatchNorm sees the whole data set."""
    momenta = {}
    for m in swa_model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            momenta[m] = m.momentum
            m.momentum = None
    swa_model.train()
    for x, _ in loader:
        swa_model(x.to(device))
    for m, mom in momenta.items():
        m.momentum = mom


@torch.no_grad()
def accuracy(net, loader, device):
    net.eval()
    c = torch.zeros(2, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        c += torch.stack([(net(x).argmax(1) == y).sum().float(), torch.tensor(float(len(y)), device=device)])
    dist.all_reduce(c)
    return (c[0] / c[1]).item()


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    device = torch.device("cuda", local_rank)
    rank0 = dist.get_rank() == 0

    net = nn.SyncBatchNorm.convert_sync_batchnorm(wide_cnn()).to(device)
    model = DDP(net, device_ids=[local_rank])
    swa_model = AveragedModel(model.module)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=150)
    swa_sched = SWALR(opt, swa_lr=0.02, anneal_epochs=5)
    swa_start, epochs = 150, 200

    train = TensorDataset(torch.randn(50_000, 3, 32, 32), torch.randint(0, 10, (50_000,)))
    test = TensorDataset(torch.randn(10_000, 3, 32, 32), torch.randint(0, 10, (10_000,)))
    sampler = DistributedSampler(train)
    loader = DataLoader(train, batch_size=128, sampler=sampler, num_workers=4, drop_last=True)
    test_loader = DataLoader(test, batch_size=500, sampler=DistributedSampler(test, shuffle=False))

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if epoch >= swa_start:
            swa_model.update_parameters(model.module)
            swa_sched.step()
        else:
            cosine.step()
        if epoch % 10 == 0:
            acc = accuracy(model, test_loader, device)
            if rank0:
                print(f"epoch {epoch}: test acc {acc:.4f}")

    bn_loader = DataLoader(train, batch_size=256, sampler=DistributedSampler(train, shuffle=False))
    recompute_bn(swa_model, bn_loader, device)
    swa_acc = accuracy(swa_model, test_loader, device)
    if rank0:
        print(f"SWA model test acc {swa_acc:.4f}")
        torch.save({"swa": swa_model.module.state_dict(), "n_averaged": swa_model.n_averaged}, "swa_final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
