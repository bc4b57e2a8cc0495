"""torchvision segmentation-reference shape: confusion matrix summed across ranks, per-iteration poly LR, save_on_master."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torchvision.models.segmentation import deeplabv3_resnet50


class ConfusionMatrix:
    def __init__(self, num_classes):
        self.num_classes = num_classes
        self.mat = None

    def update(self, a, b):
        n = self.num_classes
        if self.mat is None:
            self.mat = torch.zeros((n, n), dtype=torch.int64, device=a.device)
        with torch.inference_mode():
            k = (a >= 0) & (a < n)
            inds = n * a[k].to(torch.int64) + b[k]
            self.mat += torch.bincount(inds, minlength=n ** 2).reshape(n, n)

    def reduce_from_all_processes(self):
        dist.all_reduce(self.mat)

    def compute(self):
        h = self.mat.float()
        acc_global = torch.diag(h).sum() / h.sum()
        iu = torch.diag(h) / (h.sum(1) + h.sum(0) - torch.diag(h))
        return acc_global.item(), iu.mean().item()


def criterion(inputs, target):
    losses = {name: nn.functional.cross_entropy(x, target, ignore_index=255) for name, x in inputs.items()}
    return losses["out"] if len(losses) == 1 else losses["out"] + 0.5 * losses["aux"]


def evaluate(model, data_loader, device, num_classes):
    model.eval()
    confmat = ConfusionMatrix(num_classes)
    with torch.inference_mode():
        for image, target in data_loader:
            image, target = image.to(device), target.to(device)
            output = model(image)["out"]
            confmat.update(target.flatten(), output.argmax(1).flatten())
    confmat.reduce_from_all_processes()
    return confmat


def train_one_epoch(model, optimizer, data_loader, lr_scheduler, device, epoch, rank):
    model.train()
    for i, (image, target) in enumerate(data_loader):
        image, target = image.to(device), target.to(device)
        loss = criterion(model(image), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        lr_scheduler.step()
        if rank == 0 and i % 50 == 0:
            print(f"Epoch {epoch} it {i} loss {loss.item():.4f} lr {optimizer.param_groups[0]['lr']:.5f}")


def main(args, dataset, dataset_test):
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    device = torch.device(f"cuda:{local_rank}")

    train_sampler = DistributedSampler(dataset)
    test_sampler = DistributedSampler(dataset_test, shuffle=False)
    data_loader = DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler,
                             num_workers=args.workers, drop_last=True)
    data_loader_test = DataLoader(dataset_test, batch_size=1, sampler=test_sampler)

    model = deeplabv3_resnet50(num_classes=args.num_classes, aux_loss=True).to(device)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    model_without_ddp = model.module
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    iters = len(data_loader) * args.epochs
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda x: (1 - x / iters) ** 0.9)

    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        train_one_epoch(model, optimizer, data_loader, lr_scheduler, device, epoch, rank)
        confmat = evaluate(model, data_loader_test, device, args.num_classes)
        acc, miou = confmat.compute()
        if rank == 0:
            print(f"epoch {epoch}: global pixel acc {acc * 100:.2f} mIoU {miou * 100:.2f}")
            torch.save({"model": model_without_ddp.state_dict(), "epoch": epoch,
                        "optimizer": optimizer.state_dict()},
                       os.path.join(args.output_dir, "checkpoint.pth"))
    dist.destroy_process_group()
