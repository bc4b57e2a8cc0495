"""Streams in one process: how they are split, their positions, resume, and the refusals."""

from __future__ import annotations

import contextlib
import io
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch.utils.data import IterableDataset, TensorDataset

import paratrain as pt
from paratrain.data import streaming
from paratrain.data.streaming import StreamShard, fingerprint, shard_stream, splits_itself
from paratrain.errors import ConfigError, DataError
from tests.support.streams import Counting, features, train_on_stream


class Numbers(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n
        self.reads = 0

    def __iter__(self) -> Iterator[int]:
        for i in range(self.n):
            self.reads += 1
            yield i


class Resumable(IterableDataset[dict[str, Any]]):
    """A stream with its own position (like HF ``datasets``): no re-reading on resume."""

    def __init__(self, n: int) -> None:
        self.n, self.next, self.reads = n, 0, 0

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start, self.next = self.next, self.next
        for i in range(start, self.n):
            self.reads += 1
            self.next = i + 1
            yield {"id": i, "x": torch.tensor(features(i))}
        self.next = 0


def _as_worker(monkeypatch: pytest.MonkeyPatch, worker: int, workers: int) -> None:
    info = types.SimpleNamespace(id=worker, num_workers=workers)
    monkeypatch.setattr(streaming, "get_worker_info", lambda: info)


@settings(max_examples=60, deadline=None)
@given(n=hs.integers(0, 60), world=hs.integers(1, 4), workers=hs.integers(1, 3))
def test_shares_of_every_rank_and_worker_partition_the_stream(
    n: int, world: int, workers: int
) -> None:
    seen: list[int] = []
    with pytest.MonkeyPatch.context() as mp:
        for rank in range(world):
            for worker in range(workers):
                _as_worker(mp, worker, workers)
                seen += list(StreamShard(Numbers(n), rank=rank, world=world, split=True))
    assert sorted(seen) == list(range(n))


@settings(max_examples=40, deadline=None)
@given(n=hs.integers(1, 40), world=hs.integers(1, 3), cut=hs.integers(0, 40))
def test_a_saved_position_continues_exactly(n: int, world: int, cut: int) -> None:
    for make in (Numbers, Resumable):
        full = list(StreamShard(make(n), rank=world - 1, world=world, split=True))
        shard = StreamShard(make(n), rank=world - 1, world=world, split=True)
        it = iter(shard)
        head = [next(it) for _ in range(min(cut, len(full)))]
        state = shard.state_dict()
        fresh = StreamShard(make(n), rank=world - 1, world=world, split=True)
        fresh.load_state_dict(state)
        assert _ids(head + list(fresh)) == _ids(full)


def _ids(items: list[Any]) -> list[int]:
    return [x if isinstance(x, int) else x["id"] for x in items]


def test_a_dataset_with_its_own_state_is_not_read_again() -> None:
    shard = StreamShard(Resumable(20), rank=0, world=1, split=False)
    it = iter(shard)
    for _ in range(15):
        next(it)
    again = StreamShard(Resumable(20), rank=0, world=1, split=False)
    again.load_state_dict(shard.state_dict())
    assert [d["id"] for d in again] == list(range(15, 20))
    assert again.dataset.reads == 5  # type: ignore[attr-defined]
    counted = StreamShard(Numbers(20), rank=0, world=1, split=False)
    counted.load_state_dict({"consumed": 15, "dataset": None})
    assert list(counted) == list(range(15, 20))
    assert counted.dataset.reads == 20  # type: ignore[attr-defined]  # read and discarded


class _SplitsByWorker(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        info = torch.utils.data.get_worker_info()
        yield from range(0 if info is None else info.id, 10, 1 if info is None else 2)


class _SplitsInAHelper(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        def mine() -> Iterator[int]:
            yield torch.distributed.get_rank()

        return mine()


def test_which_datasets_split_themselves() -> None:
    assert splits_itself(_SplitsByWorker())
    assert splits_itself(_SplitsInAHelper())
    assert not splits_itself(Numbers(3))
    import webdataset as wds

    assert splits_itself(wds.WebDataset(["x.tar"], shardshuffle=False, empty_check=False))
    assert shard_stream(Numbers(3), rank=0, world=2, shard="auto")[0].split
    assert not shard_stream(_SplitsByWorker(), rank=0, world=2, shard="auto")[0].split
    assert shard_stream(_SplitsByWorker(), rank=0, world=2, shard=True)[0].split
    assert not shard_stream(Numbers(3), rank=0, world=2, shard=False)[0].split


@pytest.mark.parametrize("shard", ["yes", 1, None, 0.5, "AUTO"])
def test_a_bad_shard_value_is_refused(shard: Any) -> None:
    with pytest.raises(ConfigError, match="shard="):
        shard_stream(Numbers(3), rank=0, world=1, shard=shard)


def test_fingerprints_follow_the_contents() -> None:
    a = {"id": torch.tensor([1, 2]), "x": [torch.zeros(2), "s"]}
    b = {"x": [torch.zeros(2), "s"], "id": torch.tensor([1, 2])}
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint({**a, "id": torch.tensor([1, 3])})
    assert fingerprint(torch.zeros(2)) != fingerprint(torch.zeros(2, dtype=torch.float64))


def test_run_refuses_what_a_stream_cannot_do(tmp_path: Path) -> None:
    with pt.Run(strategy="cpu", run_dir=tmp_path, progress=False) as run:
        with pytest.raises(ConfigError, match="IterableDataset"):
            run.loader(Numbers(4), batch_size=2, sampler=None)
        with pytest.raises(ConfigError, match="map-style"):
            run.loader(TensorDataset(torch.zeros(4)), batch_size=2, shard=True)
        with pytest.raises(ConfigError, match="shard="):
            run.loader(Numbers(4), batch_size=2, shard="files")
        loader = run.loader(Numbers(4), batch_size=2)
        with pytest.raises(TypeError, match="has no length"):
            len(loader)
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    ("source", "workers", "loader_first"),
    [(("Counting", 23), 2, False), (("Resumable", 23), 0, False), (("Counting", 23), 0, True)],
)
def test_stop_and_resume_in_one_process_is_exact(
    tmp_path: Path,
    source: tuple[str, Any],
    workers: int,
    loader_first: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tests.support.streams as streams_module

    monkeypatch.setattr(streams_module, "Resumable", Resumable, raising=False)
    kw: dict[str, Any] = {"strategy": "cpu", "workers": workers, "loader_first": loader_first}
    straight = train_on_stream(source, str(tmp_path / "a"), **kw)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        first = train_on_stream(source, str(tmp_path / "b"), stop_at=5, **kw)
        rest = train_on_stream(source, str(tmp_path / "b"), **kw)
    assert first["seen"] + rest["seen"] == straight["seen"]
    for name, value in straight["weights"].items():
        assert torch.equal(rest["weights"][name], value)
    assert ("reads and discards" in err.getvalue()) == (source[0] == "Counting")


@pytest.mark.parametrize("workers", [0, 2])
def test_the_skip_of_a_resume_at_another_layout_is_for_the_resumed_epoch_only(
    tmp_path: Path, workers: int
) -> None:
    err = io.StringIO()
    fork = {"multiprocessing_context": "fork"} if workers else {}
    epochs: list[list[int]] = []
    with contextlib.redirect_stderr(err), pt.Run(strategy="cpu", run_dir=tmp_path) as run:
        loader = run.loader(Counting(12), batch_size=2, num_workers=workers, **fork)
        # What a resume applies when the checkpoint was written at another layout and holds no
        # stream state paratrain can map: the position only.
        loader.load_state_dict({"epoch": 0, "samples": 6, "finished": False, "running": True})
        for _ in run.epochs(3):
            epochs.append(sorted(int(i) for batch in loader for i in batch["id"]))
    assert len(epochs[0]) == 6 and len(set(epochs[0])) == 6  # about its share skipped
    assert epochs[1] == epochs[2] == list(range(12))  # the next epochs are whole
    assert "another layout" in err.getvalue()


def test_a_resumed_pass_left_early_starts_its_epoch_over_whole(tmp_path: Path) -> None:
    with contextlib.redirect_stderr(io.StringIO()), pt.Run(strategy="cpu", run_dir=tmp_path) as run:
        loader = run.loader(
            Counting(12), batch_size=2, num_workers=2, multiprocessing_context="fork"
        )
        loader.load_state_dict({"epoch": 0, "samples": 6, "finished": False, "running": True})
        next(iter(loader))  # the resumed pass, left after one batch
        again = sorted(int(i) for batch in loader for i in batch["id"])
    assert again == list(range(12))  # the epoch starts over: the resume's skip is spent


def _by_epoch(*runs: dict[str, Any]) -> dict[int, list[int]]:
    ids: dict[int, list[int]] = {}
    for run in runs:
        for epoch, step in zip(run["epochs"], run["seen"], strict=True):
            ids.setdefault(epoch, []).extend(step)
    return {epoch: sorted(seen) for epoch, seen in ids.items()}


@pytest.mark.parametrize(("before", "after"), [(2, 3), (2, 0), (0, 2)])
def test_a_resume_with_another_worker_count_splits_the_stream_anew(
    tmp_path: Path, before: int, after: int
) -> None:
    source = ("Counting", 23)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        first = train_on_stream(source, str(tmp_path), stop_at=3, workers=before, strategy="cpu")
        rest = train_on_stream(source, str(tmp_path), epochs=3, workers=after, strategy="cpu")
    assert _by_epoch(first, rest) == {e: list(range(23)) for e in range(3)}  # each id once
    assert f"{before} DataLoader worker(s)" in err.getvalue()


def test_two_resumes_in_one_epoch_on_three_layouts_see_each_example_once(tmp_path: Path) -> None:
    source, root = ("Counting", 23), str(tmp_path)
    with contextlib.redirect_stderr(io.StringIO()):
        first = train_on_stream(source, root, stop_at=3, workers=2, strategy="cpu")
        second = train_on_stream(source, root, stop_at=6, workers=3, strategy="cpu")
        rest = train_on_stream(source, root, epochs=3, workers=0, strategy="cpu")
    assert second["epochs"] == [0, 0, 0]  # stopped again inside the resumed epoch
    assert _by_epoch(first, second, rest) == {e: list(range(23)) for e in range(3)}


def test_a_stream_read_in_another_order_by_each_worker_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="order") as info:
        train_on_stream(("GloballyShuffled", 40), str(tmp_path), workers=2, strategy="cpu")
    assert "random.Random" in str(info.value)  # the fix: a generator seeded by seed and epoch


def _own_loop(root: str, stop: int | None) -> list[int]:
    seen: list[int] = []
    with pt.Run(strategy="cpu", run_dir=root, progress=False) as run:
        net = torch.nn.Linear(4, 1)
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        run.resume()
        it = iter(run.loader(Counting(1000), batch_size=4, num_workers=0))
        while run.global_step < 8:  # nanoGPT's shape: one iterator, drawn from forever
            batch = next(it)
            seen += [int(i) for i in batch["id"]]
            run.backward(model(batch["x"]).sum())
            run.step(opt)
            if run.global_step == stop:
                run.save()
                break
    return seen


def test_an_own_while_loop_over_one_iterator_resumes_exactly(tmp_path: Path) -> None:
    straight = _own_loop(str(tmp_path / "a"), None)
    assert _own_loop(str(tmp_path / "b"), 3) + _own_loop(str(tmp_path / "b"), None) == straight
    assert straight == list(range(32))


def test_an_hf_stream_is_split_once(tmp_path: Path) -> None:
    from datasets.distributed import split_dataset_by_node

    from tests.support.streams import build, write_jsonl_shards

    stream = build(("hf", write_jsonl_shards(tmp_path, shards=4, per_shard=3)))
    ours, how = shard_stream(stream, rank=1, world=2, shard="auto")
    assert "split_dataset_by_node" in how and not ours.split
    assert sorted(int(d["id"]) for d in ours) == [3, 4, 5, 9, 10, 11]  # files 1 and 3
    theirs = split_dataset_by_node(stream, rank=1, world_size=2)  # as torchtitan does
    again, how = shard_stream(theirs, rank=1, world=2, shard="auto")
    assert "already split" in how
    assert sorted(int(d["id"]) for d in again) == [3, 4, 5, 9, 10, 11]


def _iter_first(root: str, data: Any, stop: int | None) -> list[list[int]]:
    """`it = iter(loader)` before anything else of the loop: the restart must resume first."""
    seen: list[list[int]] = []
    with pt.Run(strategy="cpu", run_dir=root, progress=False) as run:
        net = torch.nn.Linear(1, 1)
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        it = iter(run.loader(data, batch_size=2, shuffle=False, num_workers=0))
        while run.global_step < 6:
            batch = next(it)
            x = batch["x"] if isinstance(batch, dict) else batch[0]
            seen.append([int(v) for v in x.view(-1)])
            run.backward(model(x.view(-1, 1).float()).sum())
            run.step(opt)
            if run.global_step == stop:
                run.save()
                break
    return seen


@pytest.mark.parametrize("kind", ["stream", "map"])
def test_a_restart_resumes_before_an_iterator_made_first(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Ids(IterableDataset[dict[str, Any]]):
        def __iter__(self) -> Iterator[dict[str, Any]]:
            yield from ({"x": torch.tensor([float(i)])} for i in range(100))

    data = Ids() if kind == "stream" else TensorDataset(torch.arange(100.0).view(-1, 1))
    straight = _iter_first(str(tmp_path / "a"), data, None)
    first = _iter_first(str(tmp_path / "b"), data, 3)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun restarted the worker
    rest = _iter_first(str(tmp_path / "b"), data, None)
    assert first + rest == straight


@pytest.mark.parametrize("workers", [0, 2])
def test_an_hf_stream_with_a_shuffle_buffer_resumes_exactly(tmp_path: Path, workers: int) -> None:
    from tests.support.streams import write_jsonl_shards

    source = ("hf-shuffled", write_jsonl_shards(tmp_path / "json", shards=2, per_shard=12))
    kw: dict[str, Any] = {"strategy": "cpu", "workers": workers}
    straight = train_on_stream(source, str(tmp_path / "a"), **kw)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        first = train_on_stream(source, str(tmp_path / "b"), stop_at=5, **kw)
        rest = train_on_stream(source, str(tmp_path / "b"), **kw)
    assert first["seen"] + rest["seen"] == straight["seen"]
    flat = [i for step in straight["seen"] for i in step]
    assert flat[:12] != sorted(flat[:12])  # it is shuffled
    assert "reads and discards" in err.getvalue()  # replayed, not HF's buffer-losing state
