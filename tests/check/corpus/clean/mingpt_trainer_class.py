"""minGPT trainer shape: single-device Trainer class with a config object, callbacks and an infinite iterator loop."""
import time
from collections import defaultdict

import torch
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import RandomSampler


class CfgNode:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class Trainer:
    @staticmethod
    def get_default_config():
        return CfgNode(device="auto", num_workers=4, max_iters=None, batch_size=64,
                       learning_rate=3e-4, betas=(0.9, 0.95), weight_decay=0.1, grad_norm_clip=1.0)

    def __init__(self, config, model, train_dataset):
        self.config = config
        self.model = model
        self.optimizer = None
        self.train_dataset = train_dataset
        self.callbacks = defaultdict(list)
        if config.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            self.device = config.device
        self.model = self.model.to(self.device)
        print("running on device", self.device)
        self.iter_num = 0
        self.iter_time = 0.0
        self.iter_dt = 0.0

    def add_callback(self, onevent: str, callback):
        self.callbacks[onevent].append(callback)

    def trigger_callbacks(self, onevent: str):
        for callback in self.callbacks.get(onevent, []):
            callback(self)

    def run(self):
        model, config = self.model, self.config
        self.optimizer = model.configure_optimizers(config)
        train_loader = DataLoader(
            self.train_dataset,
            sampler=RandomSampler(self.train_dataset, replacement=True, num_samples=int(1e10)),
            shuffle=False, pin_memory=True, batch_size=config.batch_size, num_workers=config.num_workers)
        model.train()
        self.iter_num = 0
        self.iter_time = time.time()
        data_iter = iter(train_loader)
        while True:
            try:
                batch = next(data_iter)
            except StopIteration:
                data_iter = iter(train_loader)
                batch = next(data_iter)
            batch = [t.to(self.device) for t in batch]
            x, y = batch
            logits, self.loss = model(x, y)
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_norm_clip)
            self.optimizer.step()
            self.trigger_callbacks("on_batch_end")
            self.iter_num += 1
            tnow = time.time()
            self.iter_dt = tnow - self.iter_time
            self.iter_time = tnow
            if config.max_iters is not None and self.iter_num >= config.max_iters:
                break


def batch_end_callback(trainer):
    if trainer.iter_num % 100 == 0:
        print(f"iter_dt {trainer.iter_dt * 1000:.2f}ms; iter {trainer.iter_num}: "
              f"train loss {trainer.loss.item():.5f}")
    if trainer.iter_num % 1000 == 0:
        torch.save(trainer.model.state_dict(), "model.pt")


if __name__ == "__main__":
    from mingpt.model import GPT
    from mingpt.utils import CharDataset

    dataset = CharDataset(open("input.txt").read(), block_size=128)
    model_config = GPT.get_default_config()
    model_config.model_type = "gpt-mini"
    model_config.vocab_size = dataset.get_vocab_size()
    model_config.block_size = dataset.get_block_size()
    gpt = GPT(model_config)
    train_config = Trainer.get_default_config()
    train_config.max_iters = 5000
    trainer = Trainer(train_config, gpt, dataset)
    trainer.add_callback("on_batch_end", batch_end_callback)
    trainer.run()
