"""Vision-language contrastive fine-tuning (CLIP-style) with DDP; the init checkpoint carries a config object.

Planted: PT009 - torch.load(f) inside `with torch.serialization.safe_globals([...])` passes no map_location.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from clip_lite import CLIPConfig, CLIPModel, ImageTextDataset


def gather_features(image_features, text_features):
    world = dist.get_world_size()
    all_img = [torch.zeros_like(image_features) for _ in range(world)]
    all_txt = [torch.zeros_like(text_features) for _ in range(world)]
    dist.all_gather(all_img, image_features)
    dist.all_gather(all_txt, text_features)
    all_img[dist.get_rank()] = image_features
    all_txt[dist.get_rank()] = text_features
    return torch.cat(all_img), torch.cat(all_txt)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init", default="clip_lite_init.pt")
    parser.add_argument("--epochs", type=int, default=32)
    parser.add_argument("--logs", default="logs/clip")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    is_master = dist.get_rank() == 0

    with open(args.init, "rb") as f:
        with torch.serialization.safe_globals([CLIPConfig]):
            init = torch.load(f)  # planted: PT009
    model = CLIPModel(init["config"])
    model.load_state_dict(init["state_dict"])
    model = DDP(model.to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.2)

    dataset = ImageTextDataset("data/cc3m", split="train")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=256, sampler=sampler, num_workers=8, drop_last=True)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for images, texts in loader:
            images = images.to(device, non_blocking=True)
            texts = texts.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                img_f, txt_f, logit_scale = model(images, texts)
            img_all, txt_all = gather_features(img_f.float(), txt_f.float())
            logits = logit_scale * img_all @ txt_all.t()
            labels = torch.arange(logits.size(0), device=device)
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if is_master:
            os.makedirs(args.logs, exist_ok=True)
            torch.save({"epoch": epoch, "state_dict": model.module.state_dict()}, os.path.join(args.logs, f"epoch_{epoch}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
