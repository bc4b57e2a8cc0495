"""Knowledge distillation: frozen teacher, student trained with DDP (imported under timm's NativeDDP alias).

torchrun --nproc_per_node=8 distill.py --teacher-ckpt teacher.pth
Planted: PT006 - the student DDP wrapper's state_dict (module.-prefixed keys) is saved
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

_logger = logging.getLogger("distill")


def make_net(width):
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 100))


def kd_loss(student_logits, teacher_logits, labels, T=4.0, alpha=0.9):
    soft = F.kl_div(F.log_softmax(student_logits / T, -1), F.softmax(teacher_logits / T, -1), reduction="batchmean")
    return alpha * soft * T * T + (1 - alpha) * F.cross_entropy(student_logits, labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--teacher-ckpt", required=True)
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--output", default="./output")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    args.rank = dist.get_rank()
    args.local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.local_rank)
    device = torch.device("cuda", args.local_rank)
    logging.basicConfig(level=logging.INFO)

    teacher = make_net(128)
    teacher.load_state_dict(torch.load(args.teacher_ckpt, map_location="cpu", weights_only=True))
    teacher.to(device).eval().requires_grad_(False)

    student = make_net(32).to(device)
    student = NativeDDP(student, device_ids=[args.local_rank])
    optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    dataset = TensorDataset(torch.randn(50000, 3, 32, 32), torch.randint(0, 100, (50000,)))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=4, pin_memory=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        student.train()
        for batch_idx, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            with torch.no_grad():
                t_logits = teacher(x)
            loss = kd_loss(student(x), t_logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.rank == 0 and batch_idx % 100 == 0:
                _logger.info("Train: %d [%d/%d] kd loss %.4f", epoch, batch_idx, len(loader), loss.item())
        scheduler.step()
        if args.rank == 0:
            os.makedirs(args.output, exist_ok=True)
            torch.save({"epoch": epoch, "state_dict": student.state_dict()}, os.path.join(args.output, "last.pth.tar"))  # planted: PT006
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
