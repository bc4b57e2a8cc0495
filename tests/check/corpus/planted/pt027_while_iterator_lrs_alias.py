"""BERT-style masked-LM pretraining driven by a step counter (while loop) with an exponential LR decay.

Planted: PT027 - sched.step() (lr_scheduler imported as lrs) runs for every micro-batch, ahead of the `micro % ACCUM == 0` optimizer step
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim import lr_scheduler as lrs
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from mlm import MaskedLMDataset, TinyBert, mask_tokens

TOTAL_UPDATES = 100_000
ACCUM = 8
LOG_EVERY = 200


def main():
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    dataset = MaskedLMDataset("/data/wiki_books_tokens", seq_len=128)
    sampler = DistributedSampler(dataset, seed=17)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=4, pin_memory=True,
                        drop_last=True)

    model = DDP(TinyBert(vocab_size=30522, hidden=512, layers=8).to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, betas=(0.9, 0.98), weight_decay=0.01)
    sched = lrs.ExponentialLR(optimizer, gamma=0.99997)

    epoch = 0
    sampler.set_epoch(epoch)
    it = iter(loader)
    micro = 0
    updates = 0
    window = torch.zeros(2, device=device)
    while updates < TOTAL_UPDATES:
        try:
            tokens = next(it)
        except StopIteration:
            epoch += 1
            sampler.set_epoch(epoch)
            it = iter(loader)
            tokens = next(it)
        tokens = tokens.to(device, non_blocking=True)
        inputs, labels = mask_tokens(tokens, mask_prob=0.15)

        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(),
                                                     labels.view(-1), ignore_index=-100)
        loss_scaled = loss / ACCUM
        loss_scaled.backward()
        window[0] += loss.detach()
        window[1] += 1
        micro += 1

        sched.step()  # planted: PT027
        if micro % ACCUM == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            updates += 1

            if updates % LOG_EVERY == 0:
                dist.all_reduce(window)
                if rank == 0:
                    print(f"update {updates} epoch {epoch} mlm loss {(window[0] / window[1]).item():.4f} "
                          f"lr {sched.get_last_lr()[0]:.2e}")
                window.zero_()
            if updates % 10_000 == 0 and rank == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "sched": sched.state_dict(), "updates": updates}, f"mlm_{updates}.pt")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
