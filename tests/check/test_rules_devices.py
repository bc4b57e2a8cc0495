"""PT001 (global rank as a device) and PT002 (a dropped ``.to`` result)."""

from __future__ import annotations

import pytest

from tests.check.snippets import flagged


def test_global_rank_as_device_is_found_once_at_its_first_use() -> None:
    bad = """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group(backend='nccl')
        local_rank = dist.get_rank()
        torch.cuda.set_device(local_rank)
        model = torch.nn.Linear(1000, 10).to(local_rank)
        ddp_model = DDP(model, device_ids=[local_rank])
    """
    assert flagged(bad, "PT001") == [7]


@pytest.mark.parametrize(
    "line",
    [
        'device = f"cuda:{rank}"',
        "model = DDP(model, device_ids=[rank])",
        "x = torch.zeros(3, device=rank)",
        "torch.cuda.set_device(dist.get_rank())",
    ],
)
def test_every_device_form_with_rank_from_the_environment(line: str) -> None:
    bad = f"""
        import os, torch
        import torch.distributed as dist
        rank = int(os.environ["RANK"])
        {line}
    """
    assert flagged(bad, "PT001") == [5]


def test_local_rank_and_spawned_rank_parameters_are_fine() -> None:
    good = """
        import os, torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        model = DDP(torch.nn.Linear(2, 2).to(local_rank), device_ids=[local_rank])

        def train(rank, world_size):
            dist.init_process_group("nccl", rank=rank, world_size=world_size)
            device = torch.device(f"cuda:{rank}")
    """
    assert flagged(good, "PT001") == []


def test_dropped_move_of_a_batch_or_a_new_tensor_is_found() -> None:
    bad = """
        import torch
        x = torch.tensor([1.0, 2.0])
        x.cuda()
        for data, target in train_loader:
            data.to(device)
            target = target.to(device)
    """
    assert flagged(bad, "PT002") == [4, 6]


def test_assigned_moves_and_modules_moved_in_place_are_fine() -> None:
    good = """
        import torch
        model = MyModel()
        model.to(device)
        for data, target in train_loader:
            data, target = data.to(device), target.to(device)
        for batch in loader:
            batch.to(device)
    """
    assert flagged(good, "PT002") == []


def test_the_whole_item_of_an_enumerated_loader_is_not_taken_for_a_tensor() -> None:
    """``for step, batch in enumerate(loader)``: a counter and the whole batch (a dict, a
    BatchEncoding, which ``.to()`` moves in place); ``(x, y)`` after the counter are tensors."""
    source = """
        for step, batch in enumerate(train_dataloader):
            batch.to(accelerator.device)
        for i, (x, y) in enumerate(train_loader):
            x.to(device)
    """
    assert flagged(source, "PT002") == [5]


def test_nccl_without_a_fallback_is_found() -> None:
    bad = """
    import torch.distributed as dist
    dist.init_process_group("nccl")
    dist.init_process_group(
        backend="nccl", init_method="env://")
    """
    assert flagged(bad, "PT017") == [3, 5]


def test_nccl_with_a_fallback_or_on_gpus_anyway_is_fine() -> None:
    fallback = """
    import torch
    import torch.distributed as dist
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    """
    gpu_only = """
    import os
    import torch.distributed as dist
    dist.init_process_group("nccl")
    model = model.to(f"cuda:{os.environ['LOCAL_RANK']}")
    """
    chosen = """
    import torch.distributed as dist
    dist.init_process_group(backend=args.backend)
    """
    for good in (fallback, gpu_only, chosen):
        assert flagged(good, "PT017") == []
