"""pytorch/examples ``word_language_model/main.py``, ported to paratrain (generated tokens).

    python word_language_model.py [--epochs 3]
    paratrain run --nproc 2 word_language_model.py

Shape: no DataLoader at all: the token stream is cut into columns by ``batchify`` and into
``bptt``-long rows by ``get_batch`` (each rank takes its own columns); an LSTM whose hidden
state, from ``model.init_hidden(bsz)``, is carried from batch to batch through the epoch and cut
from its history by ``repackage_hidden``; gradient clipping; evaluation on the validation split
after each epoch; the learning rate, a plain float, divided by 4 when the validation loss does
not improve; the best model written to ``best.pt`` in the run dir; a save every epoch.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn

import paratrain as pt


class RNNModel(nn.Module):
    """Encoder, LSTM, decoder."""

    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (
            weight.new_zeros(self.nlayers, bsz, self.nhid),
            weight.new_zeros(self.nlayers, bsz, self.nhid),
        )


def corpus(ntokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and validation tokens of a fixed Markov chain (stands in for Wikitext-2)."""
    g = torch.Generator().manual_seed(0)
    step = torch.softmax(3 * torch.randn(ntokens, ntokens, generator=g), dim=1)
    tokens = [0]
    for _ in range(2399):
        tokens.append(int(torch.multinomial(step[tokens[-1]], 1, generator=g)))
    data = torch.tensor(tokens)
    return data[:2000], data[2000:]


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source: torch.Tensor, i: int, bptt: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].reshape(-1)


def evaluate(model, data_source, args, criterion) -> float:
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(args.eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i, args.bptt)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train(run, model, optimizer, train_data, args, criterion, epoch, lr) -> None:
    model.train()
    total_loss = 0.0
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i, args.bptt)
        # Starting each batch, detach the hidden state from how it was previously produced.
        hidden = repackage_hidden(hidden)
        with run.accumulate(model):
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            run.backward(loss)
        run.step(optimizer)  # clips to --clip first
        total_loss += loss.item()
        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            run.print(
                f"| epoch {epoch:3d} | {batch:5d}/{len(train_data) // args.bptt:5d} batches "
                f"| lr {lr:02.2f} | loss {cur_loss:5.2f} | ppl {math.exp(cur_loss):8.2f}"
            )
            total_loss = 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description="word_language_model-shaped example")
    parser.add_argument("--emsize", type=int, default=16)
    parser.add_argument("--nhid", type=int, default=32)
    parser.add_argument("--nlayers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--eval-batch-size", type=int, default=10)
    parser.add_argument("--bptt", type=int, default=10)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1111)
    parser.add_argument("--log-interval", type=int, default=5)
    args = parser.parse_args()

    run = pt.Run(seed=args.seed, max_grad_norm=args.clip, progress=False)
    ntokens = 20
    train_tokens, val_tokens = corpus(ntokens)
    # Each rank trains on its own batch_size columns of the stream.
    columns = batchify(train_tokens, args.batch_size * run.world_size)
    mine = slice(run.rank * args.batch_size, (run.rank + 1) * args.batch_size)
    train_data = columns[:, mine].contiguous().to(run.device)
    val_data = batchify(val_tokens, args.eval_batch_size).to(run.device)

    model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers, args.dropout)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer = run.setup(model, optimizer)
    lr = run.extras.get("lr", args.lr)
    best_val_loss = run.extras.get("best_val_loss")
    for epoch in run.epochs(args.epochs):
        train(run, model, optimizer, train_data, args, criterion, epoch, lr)
        val_loss = evaluate(model, val_data, args, criterion)
        run.print(f"| end of epoch {epoch:3d} | valid loss {val_loss:5.2f} | lr {lr:5.3f}")
        if best_val_loss is None or val_loss < best_val_loss:
            run.save_weights(model, run.run_dir / "best.pt")
            best_val_loss = val_loss
        else:
            # Anneal the learning rate if no improvement has been seen on the validation set.
            lr /= 4.0
            for group in optimizer.param_groups:
                group["lr"] = lr
        run.save(extras={"lr": lr, "best_val_loss": best_val_loss})
    run.close()


if __name__ == "__main__":
    main()
