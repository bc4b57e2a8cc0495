"""Linear probing of a frozen pretrained ViT backbone with DDP (MoCo-v3/DINO eval_linear shape).

torchrun --nproc_per_node=8 eval_linear.py --pretrained_weights vit_small.pth
Planted: PT008 - torch.load wrapped in functools.partial with map_location but no weights_only
"""
import argparse
import functools
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger("eval_linear")
load_cpu = functools.partial(torch.load, map_location="cpu")  # planted: PT008


class PatchViT(nn.Module):
    def __init__(self, dim=384, depth=6, heads=6, patch=16):
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True), depth)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.norm(self.blocks(x))[:, 0]


def load_pretrained_weights(model, path, checkpoint_key="teacher"):
    state_dict = load_cpu(path)
    if checkpoint_key in state_dict:
        state_dict = state_dict[checkpoint_key]
    state_dict = {k.replace("module.", "").replace("backbone.", ""): v for k, v in state_dict.items()}
    msg = model.load_state_dict(state_dict, strict=False)
    logger.info("Pretrained weights loaded with msg: %s", msg)


def main(args):
    dist.init_process_group(backend="nccl")
    gpu = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(gpu)
    rank = dist.get_rank()

    backbone = PatchViT()
    load_pretrained_weights(backbone, args.pretrained_weights)
    backbone.cuda().eval().requires_grad_(False)

    linear_classifier = nn.Linear(384, args.num_labels).cuda()
    linear_classifier = DistributedDataParallel(linear_classifier, device_ids=[gpu])
    optimizer = torch.optim.SGD(linear_classifier.parameters(), lr=args.lr, momentum=0.9, weight_decay=0)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs, eta_min=0)

    dataset_train = TensorDataset(torch.randn(20000, 3, 224, 224), torch.randint(0, args.num_labels, (20000,)))
    sampler = DistributedSampler(dataset_train)
    train_loader = DataLoader(dataset_train, sampler=sampler, batch_size=args.batch_size_per_gpu, num_workers=8,
                              pin_memory=True)

    for epoch in range(args.epochs):
        train_loader.sampler.set_epoch(epoch)
        linear_classifier.train()
        for it, (inp, target) in enumerate(train_loader):
            inp = inp.cuda(non_blocking=True)
            target = target.cuda(non_blocking=True)
            with torch.no_grad():
                feats = backbone(inp)
            loss = F.cross_entropy(linear_classifier(feats), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and it % 50 == 0:
                logger.info("Epoch [%d] it %d loss %.4f lr %.5f", epoch, it, loss.item(), optimizer.param_groups[0]["lr"])
        scheduler.step()
        if rank == 0:
            save_dict = {"epoch": epoch + 1, "state_dict": linear_classifier.module.state_dict(),
                         "optimizer": optimizer.state_dict()}
            torch.save(save_dict, os.path.join(args.output_dir, "checkpoint.pth.tar"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser("Evaluation with linear classification")
    parser.add_argument("--pretrained_weights", required=True)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--batch_size_per_gpu", type=int, default=128)
    parser.add_argument("--num_labels", type=int, default=1000)
    parser.add_argument("--output_dir", default=".")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
