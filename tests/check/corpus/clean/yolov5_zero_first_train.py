"""YOLOv5 train.py shape: module-level RANK/LOCAL_RANK, torch_distributed_zero_first, RANK in {-1, 0} guards, broadcast stop flag."""
import os
from contextlib import contextmanager
from copy import deepcopy
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, distributed

from utils.dataloaders import LoadImagesAndLabels, check_dataset
from utils.loss import ComputeLoss
from models.yolo import Model

LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
RANK = int(os.getenv("RANK", -1))
WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1))


@contextmanager
def torch_distributed_zero_first(local_rank: int):
    if local_rank not in [-1, 0]:
        dist.barrier(device_ids=[local_rank])
    yield
    if local_rank == 0:
        dist.barrier(device_ids=[0])


class EarlyStopping:
    def __init__(self, patience=30):
        self.best_fitness, self.best_epoch, self.patience = 0.0, 0, patience

    def __call__(self, epoch, fitness):
        if fitness >= self.best_fitness:
            self.best_epoch, self.best_fitness = epoch, fitness
        return (epoch - self.best_epoch) >= self.patience


def train(hyp, opt, device, validate):
    save_dir = Path(opt.save_dir)
    with torch_distributed_zero_first(LOCAL_RANK):
        data_dict = check_dataset(opt.data)
    model = Model(opt.cfg, ch=3, nc=int(data_dict["nc"])).to(device)
    ema = deepcopy(model).eval() if RANK in {-1, 0} else None
    nbs = 64
    accumulate = max(round(nbs / opt.batch_size), 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=hyp["lr0"], momentum=hyp["momentum"], nesterov=True)
    if RANK != -1:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = DDP(model, device_ids=[LOCAL_RANK], output_device=LOCAL_RANK)
    with torch_distributed_zero_first(LOCAL_RANK):
        dataset = LoadImagesAndLabels(data_dict["train"], 640, opt.batch_size // WORLD_SIZE, augment=True)
    sampler = None if LOCAL_RANK == -1 else distributed.DistributedSampler(dataset, shuffle=True)
    train_loader = DataLoader(dataset, batch_size=opt.batch_size // WORLD_SIZE, shuffle=sampler is None,
                              sampler=sampler, num_workers=8, collate_fn=LoadImagesAndLabels.collate_fn)
    compute_loss = ComputeLoss(model)
    scaler = torch.amp.GradScaler("cuda", enabled=opt.amp)
    stopper, stop = EarlyStopping(patience=opt.patience), False
    nb = len(train_loader)
    for epoch in range(opt.epochs):
        model.train()
        if RANK != -1:
            train_loader.sampler.set_epoch(epoch)
        optimizer.zero_grad()
        for i, (imgs, targets, paths, _) in enumerate(train_loader):
            ni = i + nb * epoch
            imgs = imgs.to(device, non_blocking=True).float() / 255
            with torch.autocast(device_type="cuda", enabled=opt.amp):
                pred = model(imgs)
                loss, loss_items = compute_loss(pred, targets.to(device))
                if RANK != -1:
                    loss *= WORLD_SIZE
            scaler.scale(loss / accumulate).backward()
            if (ni + 1) % accumulate == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                if ema is not None:
                    src = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
                    ema.load_state_dict(src)
            if RANK in {-1, 0} and i % 50 == 0:
                print(f"{epoch}/{opt.epochs - 1} {i}/{nb} loss {loss_items.sum().item():.4f}")
        if RANK in {-1, 0}:
            results = validate(ema, data_dict["val"], batch_size=opt.batch_size // WORLD_SIZE * 2)
            fitness = 0.1 * results[2] + 0.9 * results[3]
            stop = stopper(epoch=epoch, fitness=fitness)
            ckpt = {"epoch": epoch, "ema": ema.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(ckpt, save_dir / "last.pt")
            if stopper.best_epoch == epoch:
                torch.save(ckpt, save_dir / "best.pt")
            del ckpt
        if RANK != -1:
            broadcast_list = [stop if RANK == 0 else None]
            dist.broadcast_object_list(broadcast_list, 0)
            if RANK != 0:
                stop = broadcast_list[0]
        if stop:
            break
    torch.cuda.empty_cache()


def main(opt, hyp, validate):
    if LOCAL_RANK != -1:
        torch.cuda.set_device(LOCAL_RANK)
        device = torch.device("cuda", LOCAL_RANK)
        dist.init_process_group(backend="nccl")
    else:
        device = torch.device("cuda:0")
    train(hyp, opt, device, validate)
    if WORLD_SIZE > 1 and RANK == 0:
        print("Destroying process group... ")
    if WORLD_SIZE > 1:
        dist.destroy_process_group()
