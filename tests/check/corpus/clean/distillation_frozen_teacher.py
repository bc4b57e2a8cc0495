"""Knowledge-distillation shape: frozen teacher left unwrapped on the local GPU, student under DDP, KD loss with temperature, guarded saves."""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def is_main_process():
    return dist.get_rank() == 0


def kd_loss(student_logits, teacher_logits, labels, T=4.0, alpha=0.9):
    soft = F.kl_div(F.log_softmax(student_logits / T, dim=-1), F.softmax(teacher_logits / T, dim=-1),
                    reduction="batchmean") * T * T
    return alpha * soft + (1 - alpha) * F.cross_entropy(student_logits, labels)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher-ckpt", required=True)
    ap.add_argument("--data", default="/datasets/imagenet/train")
    ap.add_argument("--epochs", type=int, default=100)
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)

    teacher = torchvision.models.resnet152(num_classes=1000)
    teacher.load_state_dict(torch.load(args.teacher_ckpt, map_location="cpu", weights_only=True))
    teacher = teacher.to(device).eval().requires_grad_(False)
    student = torchvision.models.resnet18(num_classes=1000).to(device)
    student = DDP(student, device_ids=[local_rank])

    tf = torchvision.transforms.Compose([torchvision.transforms.RandomResizedCrop(224),
                                         torchvision.transforms.ToTensor()])
    dataset = torchvision.datasets.ImageFolder(args.data, tf)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=128, sampler=sampler, num_workers=12, pin_memory=True, drop_last=True)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.2, momentum=0.9, weight_decay=5e-5)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        student.train()
        meter = torch.zeros(2, device=device)
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                with torch.no_grad():
                    t_logits = teacher(images)
                loss = kd_loss(student(images), t_logits, labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            meter += torch.stack([loss.detach().float(), torch.ones((), device=device)])
        scheduler.step()
        dist.all_reduce(meter)
        if is_main_process():
            print(f"epoch {epoch}: mean KD loss {(meter[0] / meter[1]).item():.4f}")
            torch.save({"student": student.module.state_dict(), "epoch": epoch}, "student_kd.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
