"""PT010 (every rank writes) and PT011 (a collective on the main process only)."""

from __future__ import annotations

from tests.check.snippets import flagged

HEAD = """
    import torch
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter
    dist.init_process_group("nccl")
"""


def test_saving_and_logging_on_every_rank_is_found() -> None:
    bad = (
        HEAD
        + """
    writer = SummaryWriter("runs")
    for epoch in range(3):
        loss.backward()
        torch.save(model.module.state_dict(), "model.pth")
"""
    )
    assert flagged(bad, "PT010") == [7, 10]


def test_writes_under_rank_guards_are_fine() -> None:
    good = (
        HEAD
        + """
    rank = dist.get_rank()
    if rank == 0:
        writer = SummaryWriter("runs")
    for epoch in range(3):
        loss.backward()
        if dist.get_rank() == 0 and epoch % 2 == 0:
            torch.save(model.module.state_dict(), "model.pth")
        torch.save(model.state_dict(), f"shard_rank{rank}.pt")

    def save_checkpoint(model):
        torch.save(model.state_dict(), "model.pth")

    def finish(is_main):
        if not is_main:
            return
        torch.save(model.state_dict(), "final.pth")
        loss.backward()
"""
    )
    assert flagged(good, "PT010") == []


def test_no_process_group_no_finding() -> None:
    assert flagged("import torch\nloss.backward()\ntorch.save(m, 'm.pt')\n", "PT010") == []


def test_collective_on_the_main_process_only_is_found() -> None:
    bad = (
        HEAD
        + """
    if dist.get_rank() == 0:
        print("loss", loss.item())
        dist.all_reduce(loss)
    def sync(rank):
        if rank != 0:
            return
        dist.barrier()
"""
    )
    assert flagged(bad, "PT011") == [9, 13]


def test_collectives_on_every_rank_are_fine() -> None:
    good = (
        HEAD
        + """
    dist.all_reduce(correct)
    if dist.get_rank() == 0:
        print(correct)
    if rank == 0:
        dist.broadcast(t, 0)
    else:
        dist.broadcast(t, 0)
    if epoch % 2 == 0:
        dist.barrier()
"""
    )
    assert flagged(good, "PT011") == []


def test_print_on_every_rank_is_found() -> None:
    bad = (
        HEAD
        + """
    def train(model):
        for batch in loader:
            loss = model(batch)
            loss.backward()
            print("loss", loss.item())
"""
    )
    assert flagged(bad, "PT016") == [11]


def test_guarded_or_per_rank_prints_are_fine() -> None:
    good = (
        HEAD
        + """
    rank = dist.get_rank()
    for batch in loader:
        loss = model(batch)
        loss.backward()
        if rank == 0:
            print("loss", loss.item())
        print(f"rank {rank}: {len(batch)} samples")

    def report(loss):
        print(loss)
"""
    )
    assert flagged(good, "PT016") == []
    assert flagged("import torch\nloss.backward()\nprint(loss)\n", "PT016") == []


def test_rank_in_minus_one_or_zero_is_a_main_guard() -> None:
    good = (
        HEAD
        + """
    loss.backward()
    if args.local_rank in [-1, 0]:
        print(loss.item())
        torch.save(model.state_dict(), "model.pth")
"""
    )
    assert flagged(good, "PT016") == flagged(good, "PT010") == []


VALIDATE = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    dist.init_process_group("nccl")
    sampler = DistributedSampler(val_set)
    val_loader = DataLoader(val_set, batch_size=64, sampler=sampler)

    def validate(model, rank):
        correct, total, total_loss = 0, 0, 0.0
        for x, y in val_loader:
            out = model(x)
            correct += (out.argmax(1) == y).sum().item()
            total += y.size(0)
            total_loss += loss_fn(out, y).item()
        acc = correct / total
        if rank == 0:
            print(f"accuracy {acc:.3f}")
            print("loss", total_loss / len(val_loader))
"""


def test_a_metric_of_rank_zeros_shard_is_found() -> None:
    assert flagged(VALIDATE, "PT020") == [18, 19]


def test_reduced_or_unsharded_metrics_are_fine() -> None:
    reduced = VALIDATE.replace(
        "        acc = correct / total\n",
        "        t = torch.tensor([correct, total])\n"
        "        dist.all_reduce(t)\n"
        "        correct, total = t.tolist()\n"
        "        acc = correct / total\n",
    )
    unsharded = VALIDATE.replace("sampler=sampler", "shuffle=False")
    on_rank_zero = VALIDATE.replace(
        "        correct, total, total_loss",
        "        if rank != 0:\n            return\n        correct, total, total_loss",
    )
    for good in (reduced, unsharded, on_rank_zero):
        assert flagged(good, "PT020") == []


PORT = """
    import sys
    import torch
    import paratrain as pt
    with pt.Run() as run:
        model, opt = run.setup(net, opt)
        for epoch in run.epochs(2):
            for x in loader:
                run.backward(model(x).mean())
                run.step(opt)
            print(f"epoch {epoch}")
            torch.save(net.state_dict(), f"net{epoch}.pt")
            if run.is_main:
                print("saved")
                torch.save(net.state_dict(), "last.pt")
        if bad_input:
            print("the data folder is empty", file=sys.stderr)
            sys.exit(2)
"""


def test_a_paratrain_port_is_checked_as_a_distributed_script() -> None:
    """``paratrain run --nproc N`` starts it on N ranks: a bare print and an unguarded save are
    what they are in a torchrun script; under ``run.is_main`` they are fine, and an error each
    rank stops with is its own."""
    assert flagged(PORT, "PT016") == [11]
    assert flagged(PORT, "PT010") == [12]
