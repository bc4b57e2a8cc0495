"""CLIP fine-tuning with rank-0 zero-shot evaluation, OpenCLIP main.py style (is_master(args)).

torchrun --nproc_per_node=8 main.py --epochs 10 --zeroshot-frequency 1
Planted: PT011 - dist.broadcast of the best zero-shot score is issued inside the is_master(args) block
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def is_master(args, local=False):
    return args.local_rank == 0 if local else args.rank == 0


class DualEncoder(nn.Module):
    def __init__(self, dim=256, vocab=49408, num_classes=1000):
        super().__init__()
        self.visual = nn.Sequential(nn.Conv2d(3, dim, 32, 32), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.text = nn.EmbeddingBag(vocab, dim)
        self.register_buffer("class_tokens", torch.randint(0, vocab, (num_classes, 8)))

    def forward(self, images, texts):
        return F.normalize(self.visual(images), dim=-1), F.normalize(self.text(texts), dim=-1)


@torch.no_grad()
def zero_shot_eval(model, images, labels, device):
    model.eval()
    classifier = F.normalize(model.text(model.class_tokens), dim=-1)
    feats = F.normalize(model.visual(images.to(device)), dim=-1)
    return (feats @ classifier.t()).argmax(-1).eq(labels.to(device)).float().mean()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--zeroshot-frequency", type=int, default=1)
    parser.add_argument("--logs", default="./logs")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    args.rank, args.world_size = dist.get_rank(), dist.get_world_size()
    args.local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{args.local_rank}")
    torch.cuda.set_device(device)
    logging.basicConfig(level=logging.INFO)

    dataset = TensorDataset(torch.randn(20000, 3, 224, 224), torch.randint(0, 49408, (20000, 77)))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=8, drop_last=True)
    zs_images, zs_labels = torch.randn(1000, 3, 224, 224), torch.randint(0, 1000, (1000,))

    model = DistributedDataParallel(DualEncoder().to(device), device_ids=[args.local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    best_top1 = torch.zeros((), device=device)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for images, texts in loader:
            images, texts = images.to(device, non_blocking=True), texts.to(device, non_blocking=True)
            img_f, txt_f = model(images, texts)
            logits = 100.0 * img_f @ txt_f.t()
            labels = torch.arange(logits.shape[0], device=device)
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        if (epoch + 1) % args.zeroshot_frequency == 0 and is_master(args):
            top1 = zero_shot_eval(model.module, zs_images, zs_labels, device)
            best_top1 = torch.maximum(best_top1, top1)
            dist.broadcast(best_top1, src=0)  # planted: PT011
            logging.info("Eval Epoch: %d imagenet-zeroshot-val-top1: %.4f", epoch, top1.item())
            torch.save({"epoch": epoch + 1, "state_dict": model.module.state_dict()},
                       os.path.join(args.logs, f"epoch_{epoch + 1}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
