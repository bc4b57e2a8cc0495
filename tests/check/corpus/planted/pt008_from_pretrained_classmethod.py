"""Sentence-pair classification fine-tuning; the encoder is restored by a from_pretrained() classmethod.

torchrun --nproc_per_node=4 finetune_pairs.py --model-dir bert-small/
Planted: PT008 - from_pretrained() reads pytorch_model.bin with torch.load(..., map_location=device), no weights_only
"""
import argparse
import json
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

logger = logging.getLogger(__name__)


class SmallBert(nn.Module):
    def __init__(self, vocab_size=30522, hidden_size=256, num_layers=4, num_labels=2):
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, hidden_size)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(hidden_size, 4, 4 * hidden_size,
                                                                        batch_first=True), num_layers)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, input_ids, attention_mask):
        h = self.encoder(self.embeddings(input_ids), src_key_padding_mask=attention_mask == 0)
        return self.classifier(h[:, 0])

    @classmethod
    def from_pretrained(cls, model_dir, device, **overrides):
        with open(os.path.join(model_dir, "config.json")) as f:
            config = {**json.load(f), **overrides}
        model = cls(**config)
        state_dict = torch.load(os.path.join(model_dir, "pytorch_model.bin"), map_location=device)  # planted: PT008
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        logger.debug("missing=%s unexpected=%s", missing, unexpected)
        return model


def main(args):
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    main_process = dist.get_rank() == 0

    model = SmallBert.from_pretrained(args.model_dir, device, num_labels=3).to(device)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    input_ids = torch.randint(0, 30522, (40000, 128))
    attention_mask = torch.ones_like(input_ids)
    labels = torch.randint(0, 3, (40000,))
    train_data = TensorDataset(input_ids, attention_mask, labels)
    train_sampler = DistributedSampler(train_data)
    train_dataloader = DataLoader(train_data, sampler=train_sampler, batch_size=args.train_batch_size)

    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for step, batch in enumerate(train_dataloader):
            batch = tuple(t.to(device) for t in batch)
            ids, mask, y = batch
            loss = F.cross_entropy(model(ids, mask), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            if main_process and step % 100 == 0:
                logger.info("epoch %d step %d loss %.4f", epoch, step, loss.item())

    if main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.output_dir, "pytorch_model.bin"))
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--output-dir", default="pairs-out")
    parser.add_argument("--num-train-epochs", type=int, default=3)
    parser.add_argument("--train-batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-5)
    logging.basicConfig(level=logging.INFO)
    main(parser.parse_args())
