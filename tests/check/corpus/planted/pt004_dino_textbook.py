"""Self-distillation without labels (DINO-style student/teacher with an EMA teacher) on 8 GPUs.

Planted: PT004 - the DataLoader gets both shuffle=True and sampler=
"""
import argparse
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class TwoCrops(Dataset):
    def __len__(self):
        return 1_281_167

    def __getitem__(self, i):
        img = torch.rand(3, 224, 224)
        return img.flip(-1), img + 0.05 * torch.randn_like(img)


class ProjectedBackbone(nn.Module):
    def __init__(self, out_dim=4096):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 96, 16, 16), nn.Flatten(2))
        self.blocks = nn.TransformerEncoder(nn.TransformerEncoderLayer(96, 3, 384, batch_first=True), 4)
        self.head = nn.Sequential(nn.Linear(96, 2048), nn.GELU(), nn.Linear(2048, out_dim))

    def forward(self, x):
        tokens = self.backbone(x).transpose(1, 2)
        return self.head(self.blocks(tokens).mean(1))


def dino_loss(student_out, teacher_out, center, t_s=0.1, t_t=0.04):
    t = F.softmax((teacher_out - center) / t_t, dim=-1).detach()
    return torch.sum(-t * F.log_softmax(student_out / t_s, dim=-1), dim=-1).mean()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--batch-size-per-gpu", type=int, default=64)
    ap.add_argument("--momentum-teacher", type=float, default=0.996)
    args = ap.parse_args()

    dist.init_process_group(backend="nccl", init_method="env://")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda")

    student = ProjectedBackbone().to(device)
    teacher = copy.deepcopy(student)
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = DDP(student, device_ids=[local_rank])
    center = torch.zeros(1, 4096, device=device)

    dataset = TwoCrops()
    sampler = DistributedSampler(dataset, shuffle=True)
    data_loader = DataLoader(dataset, sampler=sampler, batch_size=args.batch_size_per_gpu, shuffle=True, num_workers=10, pin_memory=True, drop_last=True)  # planted: PT004
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4, weight_decay=0.04)

    for epoch in range(args.epochs):
        data_loader.sampler.set_epoch(epoch)
        for view1, view2 in data_loader:
            view1 = view1.cuda(non_blocking=True)
            view2 = view2.cuda(non_blocking=True)
            with torch.no_grad():
                t1, t2 = teacher(view1), teacher(view2)
            s = student(torch.cat([view1, view2]))
            s1, s2 = s.chunk(2)
            loss = 0.5 * (dino_loss(s1, t2, center) + dino_loss(s2, t1, center))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for ps, pt in zip(student.module.parameters(), teacher.parameters()):
                    pt.mul_(args.momentum_teacher).add_((1 - args.momentum_teacher) * ps.detach())
                batch_center = torch.cat([t1, t2]).sum(0, keepdim=True)
                dist.all_reduce(batch_center)
                batch_center = batch_center / (2 * t1.size(0) * dist.get_world_size())
                center = center * 0.9 + batch_center * 0.1
        if dist.get_rank() == 0:
            torch.save({"student": student.module.state_dict(), "teacher": teacher.state_dict(),
                        "epoch": epoch + 1}, "dino_checkpoint.pth")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
