"""Image captioning fine-tune with a @main_process decorator and per-rank result files."""
import functools
import json
import logging
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import BlipForConditionalGeneration, BlipProcessor


def is_dist_avail_and_initialized():
    return dist.is_available() and dist.is_initialized()


def get_rank():
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def is_main_process():
    return get_rank() == 0


def main_process(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if is_main_process():
            return func(*args, **kwargs)

    return wrapper


class CaptionPairs(Dataset):
    def __init__(self, processor, split, n=2000):
        self.processor, self.split, self.n = processor, split, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        enc = self.processor(images=torch.rand(3, 384, 384), text=f"caption {i}", padding="max_length",
                             max_length=32, truncation=True, return_tensors="pt", do_rescale=False)
        return {"image_id": i, **{k: v[0] for k, v in enc.items()}}


class CaptionTask:
    def __init__(self, output_dir):
        self.output_dir = output_dir

    @main_process
    def save_model(self, model_without_ddp, optimizer, epoch, is_best):
        name = "checkpoint_best.pth" if is_best else f"checkpoint_{epoch}.pth"
        torch.save({"model": model_without_ddp.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   os.path.join(self.output_dir, name))

    @main_process
    def merge_results(self, world_size, epoch):
        merged = []
        for r in range(world_size):
            with open(os.path.join(self.output_dir, f"val_epoch{epoch}_rank{r}.json")) as f:
                merged.extend(json.load(f))
        with open(os.path.join(self.output_dir, f"val_epoch{epoch}.json"), "w") as f:
            json.dump(merged, f)
        print(f"merged {len(merged)} captions for epoch {epoch}")

    @torch.no_grad()
    def evaluation(self, model_without_ddp, loader, processor, device, epoch, rank):
        model_without_ddp.eval()
        results = []
        for batch in loader:
            pixel_values = batch["pixel_values"].to(device)
            out = model_without_ddp.generate(pixel_values=pixel_values, max_new_tokens=30, num_beams=3)
            for img_id, caption in zip(batch["image_id"].tolist(), processor.batch_decode(out, skip_special_tokens=True)):
                results.append({"image_id": img_id, "caption": caption})
        with open(os.path.join(self.output_dir, f"val_epoch{epoch}_rank{rank}.json"), "w") as f:
            json.dump(results, f)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda")
    logging.basicConfig(level=logging.INFO if is_main_process() else logging.WARN)

    processor = BlipProcessor.from_pretrained("Salesforce/blip-image-captioning-base")
    model = BlipForConditionalGeneration.from_pretrained("Salesforce/blip-image-captioning-base").to(device)
    model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.05)

    train_set, val_set = CaptionPairs(processor, "train"), CaptionPairs(processor, "val", 500)
    train_sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank)
    val_sampler = DistributedSampler(val_set, num_replicas=world_size, rank=rank, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=16, sampler=train_sampler, num_workers=4, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=32, sampler=val_sampler, num_workers=4)

    task = CaptionTask("output/caption")
    os.makedirs(task.output_dir, exist_ok=True)
    best_loss = float("inf")
    for epoch in range(5):
        train_sampler.set_epoch(epoch)
        model.train()
        loss_sum = torch.zeros(2, device=device)
        for batch in train_loader:
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items() if k != "image_id"}
            loss = model(**batch, labels=batch["input_ids"]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += torch.stack([loss.detach(), torch.ones((), device=device)])
        dist.all_reduce(loss_sum)
        epoch_loss = (loss_sum[0] / loss_sum[1]).item()
        logging.info("epoch %d train loss %.4f", epoch, epoch_loss)

        task.evaluation(model_without_ddp, val_loader, processor, device, epoch, rank)
        dist.barrier()
        task.merge_results(world_size, epoch)
        is_best = epoch_loss < best_loss
        best_loss = min(best_loss, epoch_loss)
        task.save_model(model_without_ddp, optimizer, epoch, is_best)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
