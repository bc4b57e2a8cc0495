"""Vision-language captioning runner in the style of LAVIS's RunnerBase (single file).

python -m torch.distributed.run --nproc_per_node=8 train_caption.py --cfg-path caption_coco.yaml
Planted: PT003 - per-split DistributedSamplers built in a dict comprehension, none reach a DataLoader
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


def get_rank():
    if not dist.is_available() or not dist.is_initialized():
        return 0
    return dist.get_rank()


def is_main_process():
    return get_rank() == 0


class CaptionDataset(Dataset):
    def __init__(self, split, size, max_len=30, vocab=30522):
        self.split, self.size, self.max_len, self.vocab = split, size, max_len, vocab

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return {"image": torch.randn(3, 224, 224), "text_input": torch.randint(0, self.vocab, (self.max_len,))}


class CaptionModel(nn.Module):
    def __init__(self, vocab=30522, dim=256):
        super().__init__()
        self.visual_encoder = nn.Sequential(nn.Conv2d(3, dim, 32, 32), nn.Flatten(2))
        self.embed = nn.Embedding(vocab, dim)
        self.text_decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(dim, 8, batch_first=True), 3)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, samples):
        image_embeds = self.visual_encoder(samples["image"]).transpose(1, 2)
        tokens = samples["text_input"]
        hidden = self.text_decoder(self.embed(tokens[:, :-1]), image_embeds)
        loss = F.cross_entropy(self.lm_head(hidden).transpose(1, 2), tokens[:, 1:])
        return {"loss": loss}


class RunnerBase:
    def __init__(self, cfg, model, datasets):
        self.cfg = cfg
        self.datasets = datasets
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("cuda", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.init_lr, weight_decay=0.05)
        self.samplers, self.dataloaders = self.create_loaders()

    def create_loaders(self):
        samplers = {split: DistributedSampler(ds, shuffle=(split == "train")) for split, ds in self.datasets.items()}  # planted: PT003
        loaders = {
            split: DataLoader(ds, batch_size=self.cfg.batch_size_train if split == "train" else self.cfg.batch_size_eval,
                              num_workers=self.cfg.num_workers, pin_memory=True, drop_last=(split == "train"))
            for split, ds in self.datasets.items()
        }
        return samplers, loaders

    def train_epoch(self, epoch):
        self.model.train()
        for i, samples in enumerate(self.dataloaders["train"]):
            samples = {k: v.to(self.device, non_blocking=True) for k, v in samples.items()}
            loss = self.model(samples)["loss"]
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            if i % 50 == 0 and is_main_process():
                logging.info("Train: epoch %d it %d loss %.4f", epoch, i, loss.item())

    def train(self):
        for cur_epoch in range(self.cfg.max_epoch):
            self.samplers["train"].set_epoch(cur_epoch)
            self.train_epoch(cur_epoch)
            if is_main_process():
                save_obj = {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                            "epoch": cur_epoch}
                torch.save(save_obj, os.path.join(self.cfg.output_dir, f"checkpoint_{cur_epoch}.pth"))
            dist.barrier()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cfg-path", required=True)
    parser.add_argument("--output-dir", default="output/caption")
    parser.add_argument("--max-epoch", type=int, default=10)
    parser.add_argument("--init-lr", type=float, default=1e-5)
    parser.add_argument("--batch-size-train", type=int, default=32)
    parser.add_argument("--batch-size-eval", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=4)
    cfg = parser.parse_args()
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    logging.basicConfig(level=logging.INFO)
    datasets = {"train": CaptionDataset("train", 50000), "val": CaptionDataset("val", 5000)}
    RunnerBase(cfg, CaptionModel(), datasets).train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
