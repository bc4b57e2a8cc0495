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
