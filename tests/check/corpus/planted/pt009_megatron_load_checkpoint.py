"""GPT pretraining driver in Megatron-LM's shape (print_rank_0, iteration checkpoints), data parallel only.

torchrun --nproc_per_node=8 pretrain_gpt.py --load ckpts --save ckpts
Planted: PT009 - load_checkpoint() does torch.load(checkpoint_name, weights_only=True) on every rank, no map_location
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as torchDDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def print_rank_0(message):
    if torch.distributed.is_initialized():
        if torch.distributed.get_rank() == 0:
            print(message, flush=True)
    else:
        print(message, flush=True)


def get_checkpoint_name(checkpoints_path, iteration):
    return os.path.join(checkpoints_path, f"iter_{iteration:07d}", "model_optim_rng.pt")


class GPTDataset(Dataset):
    def __init__(self, num_samples, seq_length, vocab=50304):
        self.num_samples, self.seq_length, self.vocab = num_samples, seq_length, vocab

    def __len__(self):
        return self.num_samples

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        return {"text": torch.randint(0, self.vocab, (self.seq_length + 1,), generator=g)}


class GPTModel(nn.Module):
    def __init__(self, vocab=50304, hidden=512, layers=6, heads=8):
        super().__init__()
        self.embedding = nn.Embedding(vocab, hidden)
        self.decoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, batch_first=True), layers)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.size(1), device=tokens.device)
        return self.lm_head(self.decoder(self.embedding(tokens), mask=mask, is_causal=True))


def load_checkpoint(model, optimizer, load_dir):
    tracker = os.path.join(load_dir, "latest_checkpointed_iteration.txt")
    if not os.path.isfile(tracker):
        print_rank_0(f"WARNING: could not find {tracker}, starting from random")
        return 0
    with open(tracker) as f:
        iteration = int(f.read().strip())
    checkpoint_name = get_checkpoint_name(load_dir, iteration)
    state_dict = torch.load(checkpoint_name, weights_only=True)  # planted: PT009
    model.load_state_dict(state_dict["model"])
    optimizer.load_state_dict(state_dict["optimizer"])
    print_rank_0(f"  successfully loaded checkpoint from {load_dir} at iteration {iteration}")
    return iteration


def save_checkpoint(iteration, model, optimizer, save_dir):
    if torch.distributed.get_rank() == 0:
        checkpoint_name = get_checkpoint_name(save_dir, iteration)
        os.makedirs(os.path.dirname(checkpoint_name), exist_ok=True)
        torch.save({"iteration": iteration, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                   checkpoint_name)
        with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))
    torch.distributed.barrier()


def pretrain(args):
    torch.distributed.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    model = GPTModel().cuda(torch.cuda.current_device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    iteration = load_checkpoint(model, optimizer, args.load) if args.load else 0
    model = torchDDP(model, device_ids=[local_rank])

    dataset = GPTDataset(args.train_samples, args.seq_length)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=args.micro_batch_size, sampler=sampler, num_workers=2)

    print_rank_0("> training ...")
    epoch = 0
    while iteration < args.train_iters:
        sampler.set_epoch(epoch)
        for batch in loader:
            tokens = batch["text"].cuda(non_blocking=True)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            iteration += 1
            if iteration % args.log_interval == 0:
                print_rank_0(f" iteration {iteration:8d}/{args.train_iters:8d} | lm loss (rank 0 micro-batch): {loss.item():.6E}")
            if iteration % args.save_interval == 0:
                save_checkpoint(iteration, model, optimizer, args.save)
            if iteration >= args.train_iters:
                break
        epoch += 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--load", default=None)
    parser.add_argument("--save", default="ckpts")
    parser.add_argument("--train-iters", type=int, default=100000)
    parser.add_argument("--train-samples", type=int, default=1000000)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--log-interval", type=int, default=100)
    parser.add_argument("--save-interval", type=int, default=1000)
    pretrain(parser.parse_args())
