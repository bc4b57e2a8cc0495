"""timm train.py shape: NativeDDP alias, is_primary(args) helper, reduce_tensor averaging, partial autocast, EMA."""
import argparse
import os
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.nn as nn
from timm import create_model
from timm.data import create_dataset, create_loader
from timm.utils import ModelEmaV2
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.tensorboard import SummaryWriter


def is_primary(args):
    return args.rank == 0


def reduce_tensor(tensor, n):
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    rt /= n
    return rt


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args, amp_autocast, loss_scaler, model_ema):
    model.train()
    last = time.time()
    loss_avg = torch.zeros((), device=args.device)
    for batch_idx, (input, target) in enumerate(loader):
        input, target = input.to(args.device), target.to(args.device)
        with amp_autocast():
            loss = loss_fn(model(input), target)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler.scale(loss).backward()
            loss_scaler.step(optimizer)
            loss_scaler.update()
        else:
            loss.backward()
            optimizer.step()
        if model_ema is not None:
            model_ema.update(model)
        reduced_loss = reduce_tensor(loss.detach(), args.world_size)
        loss_avg += reduced_loss
        if batch_idx % args.log_interval == 0 and is_primary(args):
            print(f"Train: {epoch} [{batch_idx}/{len(loader)}] loss {reduced_loss.item():.4f} "
                  f"({time.time() - last:.2f}s)")
            last = time.time()
    return (loss_avg / len(loader)).item()


def validate(model, loader, loss_fn, args, amp_autocast):
    model.eval()
    loss_sum = torch.zeros((), device=args.device)
    acc_sum = torch.zeros((), device=args.device)
    with torch.no_grad():
        for input, target in loader:
            input, target = input.to(args.device), target.to(args.device)
            with amp_autocast():
                output = model(input)
            loss_sum += reduce_tensor(loss_fn(output, target), args.world_size)
            acc_sum += reduce_tensor((output.argmax(-1) == target).float().mean(), args.world_size)
    return {"loss": (loss_sum / len(loader)).item(), "top1": 100 * (acc_sum / len(loader)).item()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--amp-dtype", default="float16")
    parser.add_argument("--log-interval", type=int, default=50)
    parser.add_argument("--output", default="output")
    args = parser.parse_args()

    args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    args.device = torch.device("cuda", args.local_rank)
    torch.cuda.set_device(args.device)
    dist.init_process_group(backend="nccl", init_method="env://")
    args.world_size = dist.get_world_size()
    args.rank = dist.get_rank()

    model = create_model(args.model, num_classes=1000).to(args.device)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model_ema = ModelEmaV2(model, decay=0.9998)
    model = NativeDDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    amp_dtype = torch.bfloat16 if args.amp_dtype == "bfloat16" else torch.float16
    amp_autocast = partial(torch.autocast, device_type="cuda", dtype=amp_dtype)
    loss_scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None

    dataset_train = create_dataset("", root=args.data_dir, split="train", is_training=True)
    dataset_eval = create_dataset("", root=args.data_dir, split="validation")
    loader_train = create_loader(dataset_train, input_size=(3, 224, 224), batch_size=args.batch_size,
                                 is_training=True, distributed=True)
    loader_eval = create_loader(dataset_eval, input_size=(3, 224, 224), batch_size=args.batch_size,
                                is_training=False, distributed=True)
    loss_fn = nn.CrossEntropyLoss().to(args.device)

    writer = None
    if is_primary(args):
        os.makedirs(args.output, exist_ok=True)
        writer = SummaryWriter(args.output)
    best = None
    for epoch in range(args.epochs):
        if hasattr(loader_train.sampler, "set_epoch"):
            loader_train.sampler.set_epoch(epoch)
        train_loss = train_one_epoch(epoch, model, loader_train, optimizer, loss_fn, args,
                                     amp_autocast, loss_scaler, model_ema)
        metrics = validate(model, loader_eval, loss_fn, args, amp_autocast)
        if is_primary(args):
            writer.add_scalar("train/loss", train_loss, epoch)
            writer.add_scalar("eval/top1", metrics["top1"], epoch)
            if best is None or metrics["top1"] > best:
                best = metrics["top1"]
                torch.save({"state_dict": model.module.state_dict(),
                            "state_dict_ema": model_ema.module.state_dict(),
                            "epoch": epoch}, os.path.join(args.output, "model_best.pth.tar"))
            print(f"*** Best metric: {best:.3f} (epoch {epoch})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
