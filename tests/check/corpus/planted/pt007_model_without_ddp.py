"""DeiT-style fine-tuning with model_without_ddp kept for checkpointing; exports a deployable model at the end.

Planted: PT007 - torch.save(model_without_ddp, path): model_without_ddp = model.module is a whole nn.Module.
"""
import argparse
import os

import timm
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import datasets, transforms


def is_main_process():
    return dist.get_rank() == 0


def main(args):
    dist.init_process_group(backend="nccl")
    args.gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(args.gpu)
    device = torch.device("cuda")

    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    dataset_train = datasets.ImageFolder(os.path.join(args.data_path, "train"), transform=tf)
    sampler_train = DistributedSampler(dataset_train)
    data_loader_train = DataLoader(dataset_train, sampler=sampler_train, batch_size=args.batch_size, num_workers=8, drop_last=True)

    model = timm.create_model(args.model, pretrained=False, num_classes=args.nb_classes)
    if args.finetune:
        checkpoint = torch.load(args.finetune, map_location="cpu", weights_only=True)
        state = {k: v for k, v in checkpoint["model"].items() if not k.startswith("head.")}
        model.load_state_dict(state, strict=False)
    model = model.to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), lr=args.lr, weight_decay=0.05)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    for epoch in range(args.epochs):
        data_loader_train.sampler.set_epoch(epoch)
        model.train()
        for samples, targets in data_loader_train:
            samples = samples.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = criterion(model(samples), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if args.output_dir and is_main_process():
            torch.save({"model": model_without_ddp.state_dict(), "epoch": epoch}, os.path.join(args.output_dir, "checkpoint.pth"))

    if args.output_dir and is_main_process():
        torch.save(model_without_ddp, os.path.join(args.output_dir, "deploy_model.pth"))  # planted: PT007
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser("DeiT fine-tuning")
    parser.add_argument("--model", default="deit_small_patch16_224")
    parser.add_argument("--finetune", default="")
    parser.add_argument("--nb_classes", default=100, type=int)
    parser.add_argument("--batch-size", default=64, type=int)
    parser.add_argument("--epochs", default=100, type=int)
    parser.add_argument("--lr", default=5e-4, type=float)
    parser.add_argument("--data-path", default="/datasets/cifar100_folders")
    parser.add_argument("--output_dir", default="")
    main(parser.parse_args())
