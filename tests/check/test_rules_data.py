"""PT003 (unused DistributedSampler), PT004 (shuffle with a sampler), PT005 (no set_epoch)."""

from __future__ import annotations

from tests.check.snippets import flagged

GOOD = """
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    sampler = DistributedSampler(dataset)
    dataloader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=4)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for inputs, labels in dataloader:
            pass
"""


def test_idiomatic_sampler_use_is_clean() -> None:
    assert [flagged(GOOD, r) for r in ("PT003", "PT004", "PT005")] == [[], [], []]


def test_sampler_never_given_to_a_loader_is_found() -> None:
    bad = """
        class Trainer:
            def train(self, dataloader):
                sampler = DistributedSampler(dataloader, num_replicas=world_size, rank=rank)
                for batch in dataloader:
                    pass
    """
    assert flagged(bad, "PT003") == [4]


def test_shuffle_next_to_a_sampler_is_found() -> None:
    bad = """
        loader = DataLoader(ds, batch_size=32, shuffle=True, sampler=DistributedSampler(ds))
        ok = DataLoader(ds, batch_size=32, shuffle=False, sampler=DistributedSampler(ds))
    """
    assert flagged(bad, "PT004") == [2]


def test_epoch_loop_without_set_epoch_is_found() -> None:
    bad = GOOD.replace("        sampler.set_epoch(epoch)\n", "")
    assert flagged(bad, "PT005") == [6]


def test_inline_sampler_needs_loader_sampler_set_epoch() -> None:
    bad = """
        loader = DataLoader(ds, sampler=DistributedSampler(ds))
        for epoch in range(3):
            for i in range(2):
                for x, y in loader:
                    pass
    """
    assert flagged(bad, "PT005") == [3]
    good = bad.replace("for i in range(2):", "loader.sampler.set_epoch(epoch)\n            if 1:")
    assert flagged(good, "PT005") == []


def test_a_sampler_that_does_not_shuffle_needs_no_set_epoch() -> None:
    code = """
    from torch.utils.data import DataLoader, DistributedSampler
    sampler = DistributedSampler(ds, shuffle=False)
    loader = DataLoader(ds, sampler=sampler)
    for epoch in range(3):
        for x, y in loader:
            pass
    """
    assert flagged(code, "PT005") == []
    assert flagged(code.replace("shuffle=False", "shuffle=True"), "PT005") == [5]


def test_shuffle_through_a_kwargs_dict_or_a_partial_is_found() -> None:
    code = """
    import functools
    from torch.utils.data import DataLoader, DistributedSampler
    kwargs = {"batch_size": 8}
    kwargs.update({"shuffle": True})
    a = DataLoader(ds, sampler=DistributedSampler(ds), **kwargs)
    make = functools.partial(DataLoader, shuffle=True)
    b = make(ds, sampler=DistributedSampler(ds))
    """
    assert flagged(code, "PT004") == [6, 8]
