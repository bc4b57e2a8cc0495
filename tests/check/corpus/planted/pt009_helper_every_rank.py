"""Speech recognition (CTC conformer) fine-tuning with DDP; pretrained encoder weights come through a helper.

Planted: PT009 - load_pretrained() does torch.load(path, weights_only=True) with no map_location, and every rank calls it.
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from asr.data import LibriSpeech, collate_audio
from asr.model import ConformerCTC

log = logging.getLogger(__name__)


def load_pretrained(model, path):
    state = torch.load(path, weights_only=True)  # planted: PT009
    encoder_state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    model.encoder.load_state_dict(encoder_state)
    return model


def setup():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return local_rank, dist.get_rank()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pretrained", default="ssl/encoder.pt")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--out", default="conformer_ctc.pt")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    local_rank, rank = setup()
    device = torch.device("cuda", local_rank)
    model = ConformerCTC(vocab_size=32, d_model=256, n_layers=16)
    model = load_pretrained(model, args.pretrained)
    model = DDP(model.to(device), device_ids=[local_rank], find_unused_parameters=False)

    dataset = LibriSpeech("data/LibriSpeech", subsets=["train-clean-100"])
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, collate_fn=collate_audio, num_workers=4)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98))
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        sums = torch.zeros(2, device=device)
        for feats, feat_lens, tokens, token_lens in loader:
            feats, feat_lens = feats.to(device), feat_lens.to(device)
            tokens, token_lens = tokens.to(device), token_lens.to(device)
            with torch.autocast("cuda", dtype=torch.float16):
                log_probs, out_lens = model(feats, feat_lens)
            loss = ctc(log_probs.float().transpose(0, 1), tokens, out_lens, token_lens)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            sums[0] += loss.detach()
            sums[1] += 1
        dist.all_reduce(sums)
        if rank == 0:
            log.info("epoch %d: ctc loss %.3f", epoch, (sums[0] / sums[1]).item())
            torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
