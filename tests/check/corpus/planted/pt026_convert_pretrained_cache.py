"""Wav2vec-style encoder fine-tuning; the local-rank-0 process converts the released weights into a cache file first.

Planted: PT026 - the converted weights are written under `if args.local_rank in [-1, 0]` and read back on every rank with no D.barrier()
"""
import argparse
import os

import torch
import torch.distributed as D
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from speech import AudioClassifier, EmotionDataset, convert_fairseq_weights, pad_audio


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    p.add_argument("--release", default="/models/wav2vec_small.pt")
    p.add_argument("--cache", default="/tmp/wav2vec_small_converted.pt")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--max_steps", type=int, default=20_000)
    return p.parse_args()


def main():
    args = get_args()
    D.init_process_group(backend="nccl")
    torch.cuda.set_device(args.local_rank)
    device = torch.device("cuda", args.local_rank)

    if args.local_rank in [-1, 0]:
        released = torch.load(args.release, map_location="cpu", weights_only=False)
        torch.save(convert_fairseq_weights(released["model"]), args.cache)

    model = AudioClassifier(num_labels=4)
    encoder_sd = torch.load(args.cache, map_location="cpu", weights_only=True)  # planted: PT026
    model.encoder.load_state_dict(encoder_sd)
    model = DDP(model.to(device), device_ids=[args.local_rank])

    dataset = EmotionDataset("/data/iemocap", split="train")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, collate_fn=pad_audio, num_workers=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)

    step = 0
    epoch = 0
    while step < args.max_steps and epoch < args.epochs:
        sampler.set_epoch(epoch)
        model.train()
        sums = torch.zeros(2, device=device)
        for batch in loader:
            wav = batch["input_values"].to(device, non_blocking=True)
            attn = batch["attention_mask"].to(device, non_blocking=True)
            labels = batch["labels"].to(device, non_blocking=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                logits = model(wav, attention_mask=attn)
            loss = F.cross_entropy(logits.float(), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            sums[0] += loss.detach() * labels.size(0)
            sums[1] += labels.size(0)
            step += 1
        D.all_reduce(sums)
        if D.get_rank() == 0:
            print(f"epoch {epoch} step {step} loss {(sums[0] / sums[1]).item():.4f}")
            torch.save(model.module.state_dict(), "emotion_classifier.pt")
        epoch += 1
    D.destroy_process_group()


if __name__ == "__main__":
    main()
