"""DINO main_dino shape: student DDP + EMA teacher_without_ddp, utils-style is_main_process/save_on_master, optional fp16 scaler."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def is_main_process():
    return dist.get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


class DINOLoss(nn.Module):
    def __init__(self, out_dim, teacher_temp=0.04, student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.student_temp, self.teacher_temp, self.center_momentum = student_temp, teacher_temp, center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(self, student_output, teacher_output):
        s = (student_output / self.student_temp).chunk(2)
        t = F.softmax((teacher_output - self.center) / self.teacher_temp, dim=-1).detach().chunk(2)
        loss = sum(torch.sum(-t[i] * F.log_softmax(s[1 - i], dim=-1), dim=-1).mean() for i in range(2)) / 2
        self.update_center(teacher_output)
        return loss

    @torch.no_grad()
    def update_center(self, teacher_output):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)
        dist.all_reduce(batch_center)
        batch_center = batch_center / (len(teacher_output) * dist.get_world_size())
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


def train_one_epoch(student, teacher, teacher_without_ddp, dino_loss, loader, optimizer, epoch, fp16_scaler, momentum):
    for it, (images, _) in enumerate(loader):
        images = torch.cat([im.cuda(non_blocking=True) for im in images])
        with torch.autocast("cuda", dtype=torch.float16, enabled=fp16_scaler is not None):
            teacher_output = teacher(images)
            loss = dino_loss(student(images), teacher_output)
        optimizer.zero_grad()
        if fp16_scaler is None:
            loss.backward()
            optimizer.step()
        else:
            fp16_scaler.scale(loss).backward()
            fp16_scaler.step(optimizer)
            fp16_scaler.update()
        with torch.no_grad():
            for ps, pt in zip(student.module.parameters(), teacher_without_ddp.parameters()):
                pt.data.mul_(momentum).add_((1 - momentum) * ps.detach().data)
        if it % 10 == 0:
            print(f"Epoch [{epoch}] it {it} loss {loss.item():.4f}")


def setup_for_distributed(is_master):
    import builtins as __builtin__
    builtin_print = __builtin__.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    __builtin__.print = print


def train_dino(args, build_student, build_teacher, dataset):
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    dist.init_process_group(backend="nccl", init_method="env://")
    setup_for_distributed(dist.get_rank() == 0)
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=args.batch_size_per_gpu,
                                         num_workers=10, pin_memory=True, drop_last=True)
    student, teacher = build_student().cuda(), build_teacher().cuda()
    student = nn.SyncBatchNorm.convert_sync_batchnorm(student)
    teacher = nn.SyncBatchNorm.convert_sync_batchnorm(teacher)
    teacher = nn.parallel.DistributedDataParallel(teacher, device_ids=[args.gpu])
    teacher_without_ddp = teacher.module
    student = nn.parallel.DistributedDataParallel(student, device_ids=[args.gpu])
    teacher_without_ddp.load_state_dict(student.module.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    dino_loss = DINOLoss(args.out_dim).cuda()
    optimizer = torch.optim.AdamW(student.parameters())
    fp16_scaler = torch.amp.GradScaler("cuda") if args.use_fp16 else None
    for epoch in range(args.epochs):
        loader.sampler.set_epoch(epoch)
        train_one_epoch(student, teacher, teacher_without_ddp, dino_loss, loader, optimizer, epoch, fp16_scaler, 0.996)
        save_dict = {"student": student.module.state_dict(), "teacher": teacher_without_ddp.state_dict(),
                     "optimizer": optimizer.state_dict(), "epoch": epoch + 1}
        if fp16_scaler is not None:
            save_dict["fp16_scaler"] = fp16_scaler.state_dict()
        save_on_master(save_dict, os.path.join(args.output_dir, "checkpoint.pth"))
