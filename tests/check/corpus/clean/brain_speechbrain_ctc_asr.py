"""CTC speech recogniser in a Brain-class style with if_main_process() / run_on_main()."""
import logging
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


def if_main_process():
    if dist.is_initialized():
        return dist.get_rank() == 0
    return True


def ddp_barrier():
    if dist.is_initialized():
        dist.barrier()


def run_on_main(func, args=None, kwargs=None):
    args = args or []
    kwargs = kwargs or {}
    if if_main_process():
        func(*args, **kwargs)
    ddp_barrier()


def prepare_manifest(data_folder, save_json):
    if os.path.exists(save_json):
        return
    os.makedirs(os.path.dirname(save_json), exist_ok=True)
    with open(save_json, "w") as f:
        f.write("{}")
    logger.info("manifest written from %s", data_folder)


class Utterances(Dataset):
    def __len__(self):
        return 3000

    def __getitem__(self, i):
        return torch.randn(200, 80), torch.randint(1, 31, (20,))


class CTCModel(nn.Module):
    def __init__(self, n_mels=80, hidden=512, vocab=32):
        super().__init__()
        self.enc = nn.LSTM(n_mels, hidden, num_layers=3, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, vocab)

    def forward(self, feats):
        return self.out(self.enc(feats)[0]).log_softmax(-1)


class ASRBrain:
    def __init__(self, modules, hparams, run_opts):
        self.hparams = hparams
        self.local_rank = run_opts["local_rank"]
        self.device = torch.device(f"cuda:{self.local_rank}")
        self.modules = modules.to(self.device)
        self.modules = DDP(self.modules, device_ids=[self.local_rank])
        self.optimizer = torch.optim.Adam(self.modules.parameters(), lr=hparams["lr"])
        self.ctc = nn.CTCLoss(blank=0, zero_infinity=True)
        self.step = 0

    def compute_objectives(self, batch):
        feats, tokens = batch
        feats, tokens = feats.to(self.device), tokens.to(self.device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logp = self.modules(feats)
        in_lens = torch.full((feats.size(0),), logp.size(1), dtype=torch.long)
        tgt_lens = torch.full((feats.size(0),), tokens.size(1), dtype=torch.long)
        return self.ctc(logp.float().transpose(0, 1), tokens, in_lens, tgt_lens)

    def fit_batch(self, batch):
        loss = self.compute_objectives(batch)
        loss.backward()
        nn.utils.clip_grad_norm_(self.modules.parameters(), 5.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def on_stage_end(self, epoch, stage_loss):
        if if_main_process():
            logger.info("epoch %d: train loss %.3f", epoch, stage_loss)
            ckpt_dir = self.hparams["save_folder"]
            os.makedirs(ckpt_dir, exist_ok=True)
            torch.save({"model": self.modules.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "epoch": epoch}, os.path.join(ckpt_dir, f"CKPT_epoch{epoch}.ckpt"))

    def fit(self, epochs, train_set, loader_kwargs):
        sampler = DistributedSampler(train_set, shuffle=True)
        loader = DataLoader(train_set, sampler=sampler, **loader_kwargs)
        for epoch in range(1, epochs + 1):
            sampler.set_epoch(epoch)
            self.modules.train()
            avg = torch.zeros(2, device=self.device)
            for batch in loader:
                avg[0] += self.fit_batch(batch)
                avg[1] += 1
            dist.all_reduce(avg, op=dist.ReduceOp.SUM)
            self.on_stage_end(epoch, (avg[0] / avg[1]).item())


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    hparams = {"lr": 1e-3, "save_folder": "results/ctc/save", "data_folder": sys.argv[1] if len(sys.argv) > 1 else "data"}
    run_on_main(prepare_manifest, kwargs={"data_folder": hparams["data_folder"], "save_json": "results/ctc/train.json"})
    brain = ASRBrain(CTCModel(), hparams, {"local_rank": local_rank})
    brain.fit(20, Utterances(), {"batch_size": 16, "num_workers": 4, "drop_last": True})
    dist.destroy_process_group()
