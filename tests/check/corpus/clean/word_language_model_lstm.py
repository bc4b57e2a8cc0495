"""word_language_model shape: single-device LSTM LM with BPTT batches, hidden-state repackaging, lr annealing and a state_dict checkpoint."""
import argparse
import math
import time

import torch
import torch.nn as nn

import data
import model as lm


def batchify(d, bsz, device):
    nbatch = d.size(0) // bsz
    d = d.narrow(0, 0, nbatch * bsz)
    return d.view(bsz, -1).t().contiguous().to(device)


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)


def evaluate(net, data_source, ntokens, args, criterion):
    net.eval()
    total_loss = 0.0
    hidden = net.init_hidden(args.eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            x, targets = get_batch(data_source, i, args.bptt)
            output, hidden = net(x, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(x) * criterion(output.view(-1, ntokens), targets).item()
    return total_loss / (len(data_source) - 1)


def main():
    parser = argparse.ArgumentParser(description="PyTorch Wikitext-2 RNN/LSTM Language Model")
    parser.add_argument("--data", default="./data/wikitext-2")
    parser.add_argument("--lr", type=float, default=20)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=20)
    parser.add_argument("--eval_batch_size", type=int, default=10)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    corpus = data.Corpus(args.data)
    train_data = batchify(corpus.train, args.batch_size, device)
    val_data = batchify(corpus.valid, args.eval_batch_size, device)
    ntokens = len(corpus.dictionary)
    net = lm.RNNModel("LSTM", ntokens, 200, 200, 2, 0.2).to(device)
    criterion = nn.NLLLoss()
    lr, best_val_loss = args.lr, None
    for epoch in range(1, args.epochs + 1):
        epoch_start = time.time()
        net.train()
        hidden = net.init_hidden(args.batch_size)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            x, targets = get_batch(train_data, i, args.bptt)
            net.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = net(x, hidden)
            loss = criterion(output.view(-1, ntokens), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), args.clip)
            for p in net.parameters():
                p.data.add_(p.grad, alpha=-lr)
            if batch % 200 == 0 and batch > 0:
                print(f"| epoch {epoch:3d} | {batch:5d} batches | lr {lr:02.2f} | loss {loss.item():5.2f}")
        val_loss = evaluate(net, val_data, ntokens, args, criterion)
        print(f"| end of epoch {epoch:3d} | time: {time.time() - epoch_start:5.2f}s | valid ppl {math.exp(val_loss):8.2f}")
        if not best_val_loss or val_loss < best_val_loss:
            with open(args.save, "wb") as f:
                torch.save(net.state_dict(), f)
            best_val_loss = val_loss
        else:
            lr /= 4.0
    net.load_state_dict(torch.load(args.save, map_location=device, weights_only=True))


if __name__ == "__main__":
    main()
