"""PT012 (torch.cuda.amp), PT013 (SyncBatchNorm with DataParallel), PT014 (DataParallel),
PT015 (removed Pipe)."""

from __future__ import annotations

from tests.check.snippets import flagged


def test_cuda_amp_is_found_through_imports_too() -> None:
    bad = """
        import torch
        from torch.cuda.amp import GradScaler, autocast
        scaler = torch.cuda.amp.GradScaler()
        with autocast():
            pass
        s2 = GradScaler()
    """
    assert flagged(bad, "PT012") == [4, 5, 7]


def test_device_generic_amp_is_fine() -> None:
    good = """
        import torch
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pass
    """
    assert flagged(good, "PT012") == []


def test_syncbn_with_dataparallel_is_found_and_with_ddp_is_fine() -> None:
    bad = """
        import torch.nn as nn
        model = nn.DataParallel(model)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    """
    assert flagged(bad, "PT013") == [4]
    assert flagged(bad, "PT014") == [3]
    good = bad.replace("nn.DataParallel(model)", "DDP(model, device_ids=[local_rank])")
    assert flagged(good, "PT013") == []
    assert flagged(good, "PT014") == []


def test_removed_pipe_is_found() -> None:
    bad = """
        from torch.distributed.pipeline.sync import Pipe
        model = Pipe(model, chunks=8)
    """
    assert flagged(bad, "PT015") == [2]
    good = "from torch.distributed.pipelining import pipeline\n"
    assert flagged(good, "PT015") == []
