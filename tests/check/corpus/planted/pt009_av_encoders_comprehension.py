"""Audio-visual event classification: two pretrained unimodal encoders fused and fine-tuned with DDP.

torchrun --nproc_per_node=4 train_av.py --audio-ckpt audio_enc.pt --video-ckpt video_enc.pt
Planted: PT009 - encoder weights loaded in a dict comprehension with torch.load(p, weights_only=True), no map_location
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("av")


class AVClips(Dataset):
    def __len__(self):
        return 12000

    def __getitem__(self, i):
        return {"audio": torch.randn(1, 128, 100), "video": torch.randn(3, 8, 64, 64), "label": i % 309}


class AVFusion(nn.Module):
    def __init__(self, num_classes=309, dim=256):
        super().__init__()
        self.audio = nn.Sequential(nn.Conv2d(1, dim, 8, 8), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.video = nn.Sequential(nn.Conv3d(3, dim, (2, 8, 8), (2, 8, 8)), nn.AdaptiveAvgPool3d(1), nn.Flatten())
        self.head = nn.Linear(2 * dim, num_classes)

    def forward(self, audio, video):
        return self.head(torch.cat([self.audio(audio), self.video(video)], dim=-1))


def build_model(ckpts):
    model = AVFusion()
    states = {name: torch.load(path, weights_only=True) for name, path in ckpts.items()}  # planted: PT009
    for name, sd in states.items():
        getattr(model, name).load_state_dict(sd)
    return model


def main(args):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    rank = dist.get_rank()

    model = build_model({"audio": args.audio_ckpt, "video": args.video_ckpt}).to(device)
    model = DDP(model, device_ids=[local_rank])
    head_params = [p for n, p in model.named_parameters() if "head" in n]
    enc_params = [p for n, p in model.named_parameters() if "head" not in n]
    optimizer = torch.optim.AdamW([{"params": enc_params, "lr": args.lr * 0.1}, {"params": head_params}], lr=args.lr)

    dataset = AVClips()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=6)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for it, batch in enumerate(loader):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(batch["audio"], batch["video"])
            loss = F.cross_entropy(logits.float(), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 0 and it % 50 == 0:
                log.info("ep %d it %d loss %.4f", epoch, it, loss.item())
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, os.path.join(args.out, "av_fusion.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--audio-ckpt", required=True)
    parser.add_argument("--video-ckpt", required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--out", default=".")
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
