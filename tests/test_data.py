import dataclasses
from collections import namedtuple

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from paratrain import to_device
from paratrain.data.build import check_batch_size
from paratrain.data.loader import ExactOnceSampler, ShardedSampler, build_sampler
from paratrain.errors import ConfigError
from tests.support.training import dataset


def _epoch_order(world: int, rank: int, epoch: int, seed: int = 0, n: int = 50) -> list[int]:
    sampler = build_sampler(
        dataset(n),
        train=True,
        shuffle=True,
        drop_last=False,
        seed=seed,
        rank=rank,
        world_size=world,
    )
    assert isinstance(sampler, ShardedSampler)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_every_epoch_has_a_new_order_and_the_same_seed_repeats_it() -> None:
    orders = [_epoch_order(1, 0, e) for e in range(4)]
    assert len({tuple(o) for o in orders}) == 4
    assert orders[2] == _epoch_order(1, 0, 2)
    assert orders[2] != _epoch_order(1, 0, 2, seed=1)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_see_disjoint_slices_of_one_permutation(world: int) -> None:
    n = 48
    parts = [_epoch_order(world, r, epoch=1, n=n) for r in range(world)]
    assert all(len(p) == n // world for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(n))
    # Interleaved, the ranks' slices are the one-process order: batches compose a global batch.
    interleaved = [parts[r][i] for i in range(n // world) for r in range(world)]
    assert interleaved == _epoch_order(1, 0, epoch=1, n=n)


def test_training_sampler_pads_so_every_rank_runs_the_same_batches() -> None:
    parts = [_epoch_order(3, r, epoch=0, n=10) for r in range(3)]
    assert [len(p) for p in parts] == [4, 4, 4]


@given(n=st.integers(0, 200), world=st.integers(1, 9))
def test_exact_once_sampler_covers_each_index_once(n: int, world: int) -> None:
    parts = [list(ExactOnceSampler(n, rank=r, world_size=world)) for r in range(world)]
    assert sorted(i for p in parts for i in p) == list(range(n))
    assert max(map(len, parts), default=0) - min(map(len, parts), default=0) <= 1


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    meta: str


def test_to_device_handles_nested_containers() -> None:
    Pair = namedtuple("Pair", "a b")
    batch = {"pair": Pair(torch.ones(1), [torch.zeros(2), 3]), "dc": Batch(torch.ones(2), "m")}
    moved = to_device(batch, torch.device("meta"))
    assert moved["pair"].a.is_meta and isinstance(moved["pair"], Pair)
    assert moved["pair"].b[0].is_meta and moved["pair"].b[1] == 3
    assert isinstance(moved["dc"], Batch) and moved["dc"].x.is_meta and moved["dc"].meta == "m"


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "32"])
def test_batch_size_must_be_positive_integer(bad: object) -> None:
    with pytest.raises(ConfigError, match="per-rank"):
        check_batch_size(bad)


def test_sharded_sampler_matches_distributed_sampler() -> None:
    for n, world, drop_last in [(50, 3, False), (50, 3, True), (7, 4, False), (2, 4, False)]:
        for rank in range(world):
            ours = ShardedSampler(
                n, rank=rank, world_size=world, shuffle=True, seed=5, drop_last=drop_last
            )
            ref = DistributedSampler(
                dataset(n), num_replicas=world, rank=rank, shuffle=True, seed=5, drop_last=drop_last
            )
            ours.set_epoch(3)
            ref.set_epoch(3)
            assert list(ours) == list(ref) and len(ours) == len(ref)


@pytest.mark.parametrize("new_world", [1, 2, 3])
def test_resumed_pass_continues_the_global_order(new_world: int) -> None:
    # Two ranks consumed 3 batches of 4 each: the first 24 samples of the global order.
    full = ShardedSampler(60, rank=0, world_size=1, shuffle=True, seed=0, drop_last=False)
    full.set_epoch(2)
    order = list(full)
    parts = []
    for rank in range(new_world):
        s = ShardedSampler(
            60, rank=rank, world_size=new_world, shuffle=True, seed=0, drop_last=True
        )
        s.set_epoch(2)
        s.set_start(24)
        parts.append(list(s))
    seen = sorted(i for p in parts for i in p)
    assert seen == sorted(order[24 : 24 + len(seen)]) and len(seen) >= 36 - new_world + 1
