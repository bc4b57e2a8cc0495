"""Class-based speech trainer shape: CTC fine-tuning with dict batches, self.is_main guard attribute, bf16 autocast, WER counts reduced."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.utils.tensorboard import SummaryWriter


def edit_distance(a, b):
    dp = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, dp[0] = dp[0], i
        for j, cb in enumerate(b, 1):
            prev, dp[j] = dp[j], min(dp[j] + 1, dp[j - 1] + 1, prev + (ca != cb))
    return dp[-1]


class CTCTrainer:
    def __init__(self, model, processor, train_set, eval_set, collate, output_dir, lr=1e-4, epochs=20):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.rank = dist.get_rank()
        self.is_main = self.rank == 0
        self.device = torch.device(f"cuda:{self.local_rank}")
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank], find_unused_parameters=True)
        self.processor = processor
        self.epochs = epochs
        self.output_dir = output_dir
        self.train_sampler = DistributedSampler(train_set, shuffle=True)
        self.train_loader = DataLoader(train_set, batch_size=8, sampler=self.train_sampler, collate_fn=collate)
        self.eval_loader = DataLoader(eval_set, batch_size=8, collate_fn=collate,
                                      sampler=DistributedSampler(eval_set, shuffle=False))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.writer = SummaryWriter(os.path.join(output_dir, "tb")) if self.is_main else None

    def _to_device(self, batch):
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_epoch(self, epoch):
        self.train_sampler.set_epoch(epoch)
        self.model.train()
        for step, batch in enumerate(self.train_loader):
            batch = self._to_device(batch)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = self.model(**batch).loss
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            if self.is_main and step % 50 == 0:
                self.writer.add_scalar("train/loss", loss.item(), epoch * len(self.train_loader) + step)

    @torch.no_grad()
    def evaluate(self):
        self.model.eval()
        errors = torch.zeros(2, dtype=torch.long, device=self.device)
        for batch in self.eval_loader:
            batch = self._to_device(batch)
            logits = self.model(input_values=batch["input_values"]).logits
            preds = self.processor.batch_decode(logits.argmax(-1))
            refs = self.processor.batch_decode(batch["labels"].clamp(min=0), group_tokens=False)
            for p, r in zip(preds, refs):
                errors[0] += edit_distance(p.split(), r.split())
                errors[1] += len(r.split())
        dist.all_reduce(errors)
        return errors[0].item() / max(errors[1].item(), 1)

    def fit(self):
        best = float("inf")
        for epoch in range(self.epochs):
            self.train_epoch(epoch)
            wer = self.evaluate()
            if self.is_main:
                self.writer.add_scalar("eval/wer", wer, epoch)
                print(f"epoch {epoch}: WER {wer:.3f}")
                if wer < best:
                    best = wer
                    torch.save(self.model.module.state_dict(), os.path.join(self.output_dir, "best_ctc.pt"))
        if self.is_main:
            self.writer.close()


def main(build):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    CTCTrainer(*build()).fit()
    dist.destroy_process_group()
