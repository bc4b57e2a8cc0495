"""Train an LSTM language model on WikiText-2 using every GPU of the machine.

Planted: PT014 - the model is wrapped in nn.DataParallel
"""
import argparse
import logging

import torch
import torch.nn as nn

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)
logger = logging.getLogger("word_lm")


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp=650, nhid=650, nlayers=2, dropout=0.5):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, tokens):
        emb = self.drop(self.encoder(tokens))
        output, _ = self.rnn(emb)
        return self.decoder(self.drop(output))


def batchify(data, bsz, seq_len):
    nbatch = data.size(0) // (bsz * seq_len)
    return data[: nbatch * bsz * seq_len].view(-1, bsz, seq_len)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="./data/wikitext-2/train.pt")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=80)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()

    device = torch.device("cuda")
    corpus = torch.load(args.data, map_location="cpu", weights_only=True)
    train_data = batchify(corpus["ids"], args.batch_size, args.bptt + 1)

    model = RNNModel(corpus["ntokens"]).to(device)
    model = nn.DataParallel(model)  # planted: PT014
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.randperm(train_data.size(0))
        for i, idx in enumerate(perm.tolist()):
            chunk = train_data[idx].to(device)
            inputs, targets = chunk[:, :-1], chunk[:, 1:]
            output = model(inputs)
            loss = criterion(output.reshape(-1, output.size(-1)), targets.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizer.step()
            if i % 200 == 0:
                logger.info("| epoch %3d | %5d batches | loss %5.2f", epoch, i, loss.item())
        torch.save(model.module.state_dict(), args.save)


if __name__ == "__main__":
    main()
