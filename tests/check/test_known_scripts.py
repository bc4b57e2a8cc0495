"""``paratrain check`` on excerpts of well-known public training scripts.

Each excerpt keeps the original's lines (some functions and branches left out, nothing
rewritten) and names the file and commit it comes from. The expected findings are the ones a
reviewer would agree with, given as (rule, text of the flagged line); anything else found is a
false positive. Accelerate's and Fabric's loops are idiomatic and must be clean.

    pytest tests/check/test_known_scripts.py -q
"""

from __future__ import annotations

import ast
from typing import NamedTuple

import pytest

from paratrain.commands.check.engine import check_source, rules_by_id


class Excerpt(NamedTuple):
    name: str
    source: str
    """repository, path and commit of the original."""
    code: str
    expected: frozenset[tuple[str, str]]
    """(rule, the flagged line's code as it appears in ``code``)."""


NANOGPT = """\
import os
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
from model import GPTConfig, GPT

# various inits, derived attributes, I/O setup
ddp = int(os.environ.get('RANK', -1)) != -1 # is this a ddp run?
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ['RANK'])
    ddp_local_rank = int(os.environ['LOCAL_RANK'])
    ddp_world_size = int(os.environ['WORLD_SIZE'])
    device = f'cuda:{ddp_local_rank}'
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0 # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank # each process gets a different seed
else:
    # if not ddp, we are running on a single gpu, and one process
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
if master_process:
    os.makedirs(out_dir, exist_ok=True)
if init_from == 'scratch':
    gptconf = GPTConfig(**model_args)
    model = GPT(gptconf)
elif init_from == 'resume':
    ckpt_path = os.path.join(out_dir, 'ckpt.pt')
    checkpoint = torch.load(ckpt_path, map_location=device)
    gptconf = GPTConfig(**model_args)
    model = GPT(gptconf)
    state_dict = checkpoint['model']
    model.load_state_dict(state_dict)
model.to(device)
# initialize a GradScaler. If enabled=False scaler is a no-op
scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))
# wrap model into DDP container
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])
raw_model = model.module if ddp else model # unwrap DDP container if needed
while True:
    if iter_num % eval_interval == 0 and master_process:
        losses = estimate_loss()
        if losses['val'] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses['val']
            if iter_num > 0:
                checkpoint = {
                    'model': raw_model.state_dict(),
                    'optimizer': optimizer.state_dict(),
                }
                print(f"saving checkpoint to {out_dir}")
                torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))
    iter_num += 1
    if iter_num > max_iters:
        break
if ddp:
    destroy_process_group()
"""

IMAGENET = """\
import os
import torch
import torch.distributed as dist
import torchvision.models as models

def main_worker(gpu, ngpus_per_node, args):
    args.gpu = gpu
    if args.distributed:
        if args.multiprocessing_distributed:
            args.rank = args.rank * ngpus_per_node + gpu
        dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url,
                                world_size=args.world_size, rank=args.rank)
    if args.pretrained:
        model = models.__dict__[args.arch](pretrained=True)
    else:
        model = models.__dict__[args.arch]()
    if not use_accel:
        print('using CPU, this will be slow')
    elif args.distributed:
        if device.type == 'cuda':
            if args.gpu is not None:
                torch.cuda.set_device(args.gpu)
                model.cuda(device)
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
    elif device.type == 'cuda':
        if args.arch.startswith('alexnet') or args.arch.startswith('vgg'):
            model.features = torch.nn.DataParallel(model.features)
            model.cuda()
        else:
            model = torch.nn.DataParallel(model).cuda()
    if args.resume:
        if os.path.isfile(args.resume):
            if args.gpu is None:
                checkpoint = torch.load(args.resume)
            else:
                loc = f'{device.type}:{args.gpu}'
                checkpoint = torch.load(args.resume, map_location=loc)
    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    else:
        train_sampler = None
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)
    for epoch in range(args.start_epoch, args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer, epoch, device, args)
        acc1 = validate(val_loader, model, criterion, args)
        is_best = acc1 > best_acc1
        if not args.multiprocessing_distributed or (args.multiprocessing_distributed
                and args.rank % ngpus_per_node == 0):
            save_checkpoint({
                'epoch': epoch + 1,
                'state_dict': model.state_dict(),
                'best_acc1': best_acc1,
            }, is_best)

def save_checkpoint(state, is_best, filename='checkpoint.pth.tar'):
    torch.save(state, filename)
"""

DDP_TUTORIAL = """\
import torch
from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
import os

def ddp_setup():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl")

class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model.to(self.gpu_id)
        self.train_data = train_data
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model, device_ids=[self.gpu_id])
    def _load_snapshot(self, snapshot_path):
        loc = f"cuda:{self.gpu_id}"
        snapshot = torch.load(snapshot_path, map_location=loc)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            source = source.to(self.gpu_id)
            targets = targets.to(self.gpu_id)
            self._run_batch(source, targets)
    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.gpu_id == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)

def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        shuffle=False,
        sampler=DistributedSampler(dataset)
    )
"""

ACCELERATE = """\
import os
import torch
from torch.optim import AdamW

from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

from accelerate import Accelerator, DataLoaderConfiguration, DistributedType

def training_function(config, args):
    # Initialize accelerator
    dataloader_config = DataLoaderConfiguration(use_stateful_dataloader=args.use_stateful_dataloader)
    accelerator = Accelerator(cpu=args.cpu, mixed_precision=args.mixed_precision, dataloader_config=dataloader_config)
    lr = config["lr"]
    num_epochs = int(config["num_epochs"])
    batch_size = int(config["batch_size"])
    train_dataloader, eval_dataloader = get_dataloaders(accelerator, batch_size)
    model = AutoModelForSequenceClassification.from_pretrained("bert-base-cased", return_dict=True)
    model = model.to(accelerator.device)
    optimizer = AdamW(params=model.parameters(), lr=lr)
    lr_scheduler = get_linear_schedule_with_warmup(
        optimizer=optimizer,
        num_warmup_steps=100,
        num_training_steps=(len(train_dataloader) * num_epochs) // gradient_accumulation_steps,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    if args.resume_from_checkpoint:
        if args.resume_from_checkpoint is not None or args.resume_from_checkpoint != "":
            accelerator.print(f"Resumed from checkpoint: {args.resume_from_checkpoint}")
            accelerator.load_state(args.resume_from_checkpoint)
    for epoch in range(starting_epoch, num_epochs):
        model.train()
        if args.resume_from_checkpoint and epoch == starting_epoch and resume_step is not None:
            # We need to skip steps until we reach the resumed step only if we are not using a stateful dataloader
            if not args.use_stateful_dataloader:
                active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
            else:
                active_dataloader = train_dataloader
            overall_step += resume_step
        else:
            # After the first iteration though, we need to go back to the original dataloader
            active_dataloader = train_dataloader
        for step, batch in enumerate(active_dataloader):
            # We could avoid this line since we set the accelerator with `device_placement=True`.
            batch.to(accelerator.device)
            outputs = model(**batch)
            loss = outputs.loss
            loss = loss / gradient_accumulation_steps
            accelerator.backward(loss)
            if step % gradient_accumulation_steps == 0:
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad()
        if checkpointing_steps == "epoch":
            output_dir = f"epoch_{epoch}"
            if args.output_dir is not None:
                output_dir = os.path.join(args.output_dir, output_dir)
            accelerator.save_state(output_dir)
    accelerator.end_training()
"""  # noqa: E501 (the originals' lines)

FABRIC = """\
import torch
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torchmetrics.classification import Accuracy

from lightning.fabric import Fabric, seed_everything


def run(hparams):
    fabric = Fabric()
    seed_everything(hparams.seed)  # instead of torch.manual_seed(...)

    train_loader = torch.utils.data.DataLoader(
        train_dataset,
        batch_size=hparams.batch_size,
    )
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=hparams.batch_size)

    # don't forget to call `setup_dataloaders` to prepare for dataloaders for distributed training.
    train_loader, test_loader = fabric.setup_dataloaders(train_loader, test_loader)

    model = Net()  # remove call to .to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=hparams.lr)

    # don't forget to call `setup` to prepare for model / optimizer for distributed training.
    # the model is moved automatically to the right device.
    model, optimizer = fabric.setup(model, optimizer)

    scheduler = StepLR(optimizer, step_size=1, gamma=hparams.gamma)
    test_acc = Accuracy(task="multiclass", num_classes=10).to(fabric.device)

    for epoch in range(1, hparams.epochs + 1):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            # NOTE: no need to call `.to(device)` on the data, target
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            fabric.backward(loss)  # instead of loss.backward()
            optimizer.step()
        scheduler.step()

        model.eval()
        test_loss = 0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                test_acc(output, target)

        # all_gather is used to aggregated the value across processes
        test_loss = fabric.all_gather(test_loss).sum() / len(test_loader.dataset)
        print(f"\\nTest set: Average loss: {test_loss:.4f}, Accuracy: ({100 * test_acc.compute():.0f}%)\\n")
        test_acc.reset()

    # When using distributed training, use `fabric.save`
    # to ensure the current process is allowed to save a checkpoint
    if hparams.save_model:
        fabric.save(path="mnist_cnn.pt", state=model.state_dict())
"""  # noqa: E501 (the originals' lines)


def excerpt(name: str, source: str, code: str, *expected: tuple[str, str]) -> Excerpt:
    return Excerpt(name, source, code, frozenset(expected))


EXCERPTS = [
    # The checkpoint holds only tensors and plain values: weights_only=True would load it.
    # The master_process guard keeps torch.save on rank 0; device is the local rank's GPU.
    excerpt(
        "nanoGPT train.py",
        "karpathy/nanoGPT train.py @ 3adf61e154c3fe3fca428ad6bc3818b27a3b8291",
        NANOGPT,
        ("PT008", "checkpoint = torch.load(ckpt_path, map_location=device)"),
        ("PT012", "scaler = torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))"),
    ),
    # Both DataParallel branches; both loads lack weights_only. The first one lacks
    # map_location only in the `args.gpu is None` branch (one process driving every GPU: no
    # rank to map to), whose other branch maps: the author chose per case, so no PT009.
    # `model.state_dict()` of the wrapper goes through save_checkpoint: its keys carry
    # `module.`, but PT006 reads torch.save's own argument, and this script resumes into the
    # same wrapper, so it is not flagged. set_epoch is called; save_checkpoint runs on one
    # rank per node and is not a training function (PT010 looks inside those). main_worker
    # runs once per rank, so its unguarded print comes out world-size times.
    excerpt(
        "pytorch/examples imagenet/main.py",
        "pytorch/examples imagenet/main.py @ 77f55b912142e11fcfdf5b530231fb9c52f181e8",
        IMAGENET,
        ("PT014", "model.features = torch.nn.DataParallel(model.features)"),
        ("PT014", "model = torch.nn.DataParallel(model).cuda()"),
        ("PT008", "checkpoint = torch.load(args.resume)"),
        ("PT008", "checkpoint = torch.load(args.resume, map_location=loc)"),
        ("PT016", "print('using CPU, this will be slow')"),
        # save_checkpoint(state) writes the DDP model's own state_dict: `module.` keys
        ("PT006", "'state_dict': model.state_dict(),"),
    ),
    # LOCAL_RANK everywhere, the inner module's weights saved on local rank 0, set_epoch on the
    # loader's sampler: only the load misses weights_only.
    excerpt(
        "pytorch/examples ddp-tutorial-series multigpu_torchrun.py",
        "pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py @ "
        "77f55b912142e11fcfdf5b530231fb9c52f181e8",
        DDP_TUTORIAL,
        ("PT008", "snapshot = torch.load(snapshot_path, map_location=loc)"),
    ),
    # `batch` is a whole BatchEncoding (enumerate's second item), which .to() moves in place.
    excerpt(
        "Accelerate checkpointing example",
        "huggingface/accelerate examples/by_feature/checkpointing.py @ "
        "16cb6eb80dd9aa8b4df1a63ef57863e455d53b83",
        ACCELERATE,
    ),
    excerpt(
        "Lightning Fabric image classifier",
        "Lightning-AI/pytorch-lightning examples/fabric/image_classifier/train_fabric.py @ "
        "7f0c3436cd3f6ad3753125672024fc415cbcb414",
        FABRIC,
    ),
]


def _line_of(code: str, text: str) -> int:
    """The 1-based line of ``code`` that holds ``text`` once stripped; it must be the only one."""
    lines = [i for i, line in enumerate(code.splitlines(), 1) if line.strip() == text]
    assert len(lines) == 1, f"{text!r} is on lines {lines}"
    return lines[0]


@pytest.mark.parametrize("item", EXCERPTS, ids=[e.name for e in EXCERPTS])
def test_each_excerpt_gets_exactly_the_findings_a_reviewer_agrees_with(item: Excerpt) -> None:
    lines = item.code.splitlines()
    assert 20 <= len(lines) <= 60, len(lines)
    found = check_source(ast.parse(item.code), lines, "script.py", rules_by_id().values())
    expected = {(rule, _line_of(item.code, text)) for rule, text in item.expected}
    assert {(f.rule, f.line) for f in found} == expected
