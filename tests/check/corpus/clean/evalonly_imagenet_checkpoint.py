"""Evaluation-only: score a trained classifier checkpoint on the validation set across GPUs."""
import argparse
import os
from collections import OrderedDict

import torch
import torch.distributed as dist
import torchvision
import torchvision.transforms.v2 as T
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


def strip_prefix(state_dict, prefix="module."):
    return OrderedDict((k[len(prefix):] if k.startswith(prefix) else k, v) for k, v in state_dict.items())


@torch.inference_mode()
def evaluate(model, loader, device, num_classes):
    correct1 = torch.zeros((), dtype=torch.long, device=device)
    correct5 = torch.zeros((), dtype=torch.long, device=device)
    seen = torch.zeros((), dtype=torch.long, device=device)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long, device=device)
    for images, target in loader:
        images = images.to(device, non_blocking=True, memory_format=torch.channels_last)
        target = target.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images)
        top5 = logits.topk(5, dim=1).indices
        correct1 += (top5[:, 0] == target).sum()
        correct5 += (top5 == target[:, None]).any(dim=1).sum()
        seen += target.numel()
        confusion.index_put_((target, top5[:, 0]), torch.ones_like(target), accumulate=True)
    for t in (correct1, correct5, seen, confusion):
        dist.all_reduce(t)
    return correct1.item() / seen.item(), correct5.item() / seen.item(), confusion


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/datasets/imagenet/val")
    ap.add_argument("--arch", default="resnet50")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--batch-size", type=int, default=128)
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    device = torch.device(f"cuda:{local_rank}")
    is_rank0 = dist.get_rank() == 0

    model = torchvision.models.get_model(args.arch, num_classes=1000)
    ckpt = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    state = ckpt.get("model_ema") or ckpt.get("model") or ckpt
    missing, unexpected = model.load_state_dict(strip_prefix(state), strict=False)
    if is_rank0 and (missing or unexpected):
        print(f"missing keys: {missing}\nunexpected keys: {unexpected}")
    model = model.to(device, memory_format=torch.channels_last).eval()

    tf = T.Compose([T.Resize(256, antialias=True), T.CenterCrop(224), T.ToImage(), T.ToDtype(torch.float32, scale=True),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    val_set = torchvision.datasets.ImageFolder(args.data, tf)
    sampler = DistributedSampler(val_set, shuffle=False, drop_last=False)
    loader = DataLoader(val_set, batch_size=args.batch_size, sampler=sampler, num_workers=8, pin_memory=True)

    acc1, acc5, confusion = evaluate(model, loader, device, 1000)
    if is_rank0:
        per_class = confusion.diag().float() / confusion.sum(1).clamp(min=1).float()
        worst = per_class.argsort()[:5].tolist()
        print(f"{args.arch}: top-1 {100 * acc1:.3f}%  top-5 {100 * acc5:.3f}%  (n={confusion.sum().item()})")
        print(f"hardest classes: {[val_set.classes[i] for i in worst]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
