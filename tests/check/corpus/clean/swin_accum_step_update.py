"""Swin Transformer main.py shape: ACCUMULATION_STEPS with divided loss, per-update lr_scheduler.step_update, logger on rank 0 only."""
import logging
import os
import time

import torch
import torch.distributed as dist
from timm.loss import LabelSmoothingCrossEntropy
from timm.scheduler import CosineLRScheduler

from models import build_model
from data import build_loader


def create_logger(output_dir, dist_rank):
    logger = logging.getLogger(f"swin.{dist_rank}")
    logger.setLevel(logging.DEBUG if dist_rank == 0 else logging.WARNING)
    handler = logging.FileHandler(os.path.join(output_dir, f"log_rank{dist_rank}.txt"), mode="a")
    logger.addHandler(handler)
    return logger


def save_checkpoint(config, epoch, model_without_ddp, max_accuracy, optimizer, lr_scheduler, scaler, logger):
    save_state = {"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(),
                  "lr_scheduler": lr_scheduler.state_dict(), "max_accuracy": max_accuracy,
                  "scaler": scaler.state_dict(), "epoch": epoch}
    save_path = os.path.join(config.OUTPUT, f"ckpt_epoch_{epoch}.pth")
    logger.info(f"{save_path} saving......")
    torch.save(save_state, save_path)


def train_one_epoch(config, model, criterion, data_loader, optimizer, epoch, lr_scheduler, scaler, logger):
    model.train()
    optimizer.zero_grad()
    num_steps = len(data_loader)
    start = time.time()
    for idx, (samples, targets) in enumerate(data_loader):
        samples = samples.cuda(non_blocking=True)
        targets = targets.cuda(non_blocking=True)
        with torch.autocast(device_type="cuda", enabled=config.AMP_ENABLE):
            outputs = model(samples)
        loss = criterion(outputs, targets)
        loss = loss / config.TRAIN.ACCUMULATION_STEPS
        scaler.scale(loss).backward()
        if (idx + 1) % config.TRAIN.ACCUMULATION_STEPS == 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.TRAIN.CLIP_GRAD)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            lr_scheduler.step_update((epoch * num_steps + idx) // config.TRAIN.ACCUMULATION_STEPS)
        if idx % config.PRINT_FREQ == 0:
            logger.info(f"Train: [{epoch}][{idx}/{num_steps}] loss {loss.item():.4f}")
    logger.info(f"EPOCH {epoch} training takes {time.time() - start:.1f}s")


@torch.no_grad()
def validate(data_loader, model):
    model.eval()
    agg = torch.zeros(2, device="cuda")
    for images, target in data_loader:
        images, target = images.cuda(non_blocking=True), target.cuda(non_blocking=True)
        output = model(images)
        agg[0] += (output.argmax(-1) == target).sum()
        agg[1] += target.numel()
    dist.all_reduce(agg)
    return (100.0 * agg[0] / agg[1]).item()


def main(config):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    dist.barrier()
    logger = create_logger(config.OUTPUT, dist.get_rank())
    dataset_train, dataset_val, data_loader_train, data_loader_val, mixup_fn = build_loader(config)
    model = build_model(config).cuda()
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank], broadcast_buffers=False)
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.TRAIN.BASE_LR, weight_decay=0.05)
    steps = config.TRAIN.EPOCHS * len(data_loader_train) // config.TRAIN.ACCUMULATION_STEPS
    lr_scheduler = CosineLRScheduler(optimizer, t_initial=steps, t_in_epochs=False)
    scaler = torch.amp.GradScaler("cuda", enabled=config.AMP_ENABLE)
    criterion = LabelSmoothingCrossEntropy(smoothing=0.1)
    max_accuracy = 0.0
    for epoch in range(config.TRAIN.START_EPOCH, config.TRAIN.EPOCHS):
        data_loader_train.sampler.set_epoch(epoch)
        train_one_epoch(config, model, criterion, data_loader_train, optimizer, epoch, lr_scheduler, scaler, logger)
        if dist.get_rank() == 0 and (epoch % config.SAVE_FREQ == 0 or epoch == config.TRAIN.EPOCHS - 1):
            save_checkpoint(config, epoch, model_without_ddp, max_accuracy, optimizer, lr_scheduler, scaler, logger)
        acc1 = validate(data_loader_val, model)
        max_accuracy = max(max_accuracy, acc1)
        logger.info(f"Accuracy of the network on the test images: {acc1:.1f}% (max {max_accuracy:.2f}%)")
