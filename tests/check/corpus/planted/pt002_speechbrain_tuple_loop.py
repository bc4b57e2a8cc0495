"""CTC speech recognizer with a SpeechBrain-like Brain class, distributed with DDP.

torchrun --nproc_per_node=2 train_ctc.py --epochs 20
Planted: PT002 - each batch tensor moved with t.to(self.device) in a for loop, results dropped
"""
import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


class FbankDataset(Dataset):
    def __init__(self, n=4000, frames=400, n_mels=40, vocab=32):
        self.n, self.frames, self.n_mels, self.vocab = n, frames, n_mels, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        feats = torch.randn(self.frames, self.n_mels)
        rel_len = torch.tensor(1.0)
        tokens = torch.randint(1, self.vocab, (50,))
        return feats, rel_len, tokens


class CRDNN(nn.Module):
    def __init__(self, n_mels=40, hidden=256, vocab=32):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv1d(n_mels, hidden, 3, padding=1), nn.LeakyReLU())
        self.rnn = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, vocab)

    def forward(self, feats):
        x = self.cnn(feats.transpose(1, 2)).transpose(1, 2)
        x, _ = self.rnn(x)
        return self.out(x).log_softmax(-1)


class ASRBrain:
    def __init__(self, modules, opt_class, hparams, run_opts):
        self.hparams = hparams
        self.local_rank = run_opts["local_rank"]
        self.rank = dist.get_rank()
        self.device = torch.device(f"cuda:{self.local_rank}")
        self.modules = DistributedDataParallel(modules.to(self.device), device_ids=[self.local_rank])
        self.optimizer = opt_class(self.modules.parameters())
        self.ctc = nn.CTCLoss(blank=0, zero_infinity=True)

    def fit_batch(self, batch):
        wavs, wav_lens, tokens = batch
        for t in (wavs, wav_lens, tokens):
            t.to(self.device, non_blocking=True)  # planted: PT002
        log_probs = self.modules(wavs)
        in_lens = (wav_lens * log_probs.shape[1]).long()
        tgt_lens = torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long)
        loss = self.ctc(log_probs.transpose(0, 1), tokens, in_lens, tgt_lens)
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.modules.parameters(), 5.0)
        self.optimizer.step()
        return loss.detach()

    def fit(self, epochs, train_set, loader_kwargs):
        sampler = DistributedSampler(train_set)
        loader = DataLoader(train_set, sampler=sampler, **loader_kwargs)
        for epoch in range(1, epochs + 1):
            sampler.set_epoch(epoch)
            self.modules.train()
            avg = torch.zeros((), device=self.device)
            for n, batch in enumerate(loader, start=1):
                loss = self.fit_batch(batch)
                avg += (loss - avg) / n
            dist.all_reduce(avg, op=dist.ReduceOp.AVG)
            if self.rank == 0:
                logger.info("epoch %d train loss %.3f", epoch, avg.item())
                torch.save(self.modules.module.state_dict(),
                           os.path.join(self.hparams["save_folder"], f"CKPT_epoch{epoch}.pt"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--save-folder", default="results/ctc")
    args = parser.parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    logging.basicConfig(level=logging.INFO)
    brain = ASRBrain(
        modules=CRDNN(),
        opt_class=lambda params: torch.optim.Adam(params, lr=1e-3),
        hparams={"save_folder": args.save_folder},
        run_opts={"local_rank": local_rank},
    )
    brain.fit(args.epochs, FbankDataset(), {"batch_size": 16, "num_workers": 4, "drop_last": True})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
