"""The storage protocol: every backend keeps the same contract, and a backend written in one
file (below: ``ToyStorage``, registered for ``toy://``) is all a new place for checkpoints
needs; a run saves there and resumes exactly."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import pytest
import torch

from paratrain.checkpoint import storage as storage_module
from paratrain.checkpoint.backends import open_storage, register_storage
from paratrain.checkpoint.local_storage import LocalStorage
from paratrain.checkpoint.memory_storage import MemoryStorage
from paratrain.checkpoint.object_storage import FsspecStorage
from paratrain.checkpoint.storage import (
    Entry,
    Source,
    Storage,
    download,
    read_source,
)
from paratrain.errors import ConfigError
from tests.checkpoint.test_object_store import STOP, _train


class ToyStorage:
    """A whole backend: a dict, and nothing but the protocol's methods (no batched fast
    paths), so the generic range download is what reads it back."""

    stores: ClassVar[dict[str, dict[str, bytes]]] = {}
    commits: ClassVar[dict[str, list[tuple[str, set[str]]]]] = {}
    """URL -> (committed key, the keys present just before) per commit."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.objects = self.stores.setdefault(self.url, {})

    @classmethod
    def open(cls, url: str, options: Mapping[str, Any]) -> ToyStorage:
        return cls(url)

    def probe(self) -> None:
        pass

    def list(self, under: str = "") -> dict[str, Entry]:
        if under in self.objects:
            return {"": Entry(len(self.objects[under]), 0.0, "")}
        prefix = f"{under}/" if under else ""
        return {
            k[len(prefix) :]: Entry(len(v), 0.0, str(hash(v)))
            for k, v in self.objects.items()
            if k.startswith(prefix)
        }

    def get(self, key: str, *, start: int = 0, end: int | None = None) -> bytes | None:
        data = self.objects.get(key)
        return None if data is None else data[start:end]

    def put(self, items: Sequence[tuple[Source, str]]) -> None:
        for source, key in items:
            self.objects[key] = read_source(source)

    def commit(self, key: str, data: bytes) -> None:
        self.commits.setdefault(self.url, []).append((key, set(self.objects)))
        self.objects[key] = data

    def delete(self, keys: Iterable[str], *, recursive: bool = False) -> None:
        for key in list(keys):
            self.objects.pop(key, None)
            if recursive:
                for k in [k for k in self.objects if k.startswith(f"{key}/")]:
                    del self.objects[k]


@pytest.fixture(params=["local", "memory", "fsspec", "toy"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "local":
        yield LocalStorage(tmp_path / "store", f"file://{tmp_path}/store")
    elif request.param == "memory":
        url = f"memory://contract-{tmp_path.name}"
        yield MemoryStorage(url)
        MemoryStorage.forget(url)
    elif request.param == "fsspec":  # fsspec's own file system in memory, through FsspecStorage
        yield FsspecStorage(fsspec.filesystem("memory"), f"/{tmp_path.name}", "fsspec-memory://x")
    else:
        yield ToyStorage(f"toy://contract-{tmp_path.name}")


def test_every_backend_keeps_the_contract(storage: Storage, tmp_path: Path) -> None:
    assert isinstance(storage, Storage)
    storage.probe()
    assert storage.list() == {}
    file = tmp_path / "shard.bin"
    file.write_bytes(bytes(range(256)) * 4)
    storage.put([(file, "step-1/dcp/shard.bin"), (b"trainer", "step-1/trainer.pt")])
    storage.commit("step-1/manifest.json", b'{"step": 1}')
    listed = storage.list()
    assert sorted(listed) == ["step-1/dcp/shard.bin", "step-1/manifest.json", "step-1/trainer.pt"]
    assert listed["step-1/dcp/shard.bin"].size == 1024
    assert sorted(storage.list("step-1")) == ["dcp/shard.bin", "manifest.json", "trainer.pt"]
    assert list(storage.list("step-1/trainer.pt")) == [""]  # a key naming one object
    assert storage.get("step-1/trainer.pt") == b"trainer"
    assert storage.get("step-1/dcp/shard.bin", start=10, end=14) == bytes([10, 11, 12, 13])
    assert storage.get("step-1/dcp/shard.bin", start=1020) == bytes([252, 253, 254, 255])
    assert storage.get("step-1/missing") is None
    storage.put([(b"v2", "step-1/trainer.pt")])  # a put replaces
    assert storage.get("step-1/trainer.pt") == b"v2"
    copy = tmp_path / "copy" / "shard.bin"
    download(storage, [("step-1/dcp/shard.bin", copy)])
    assert copy.read_bytes() == file.read_bytes()
    storage.delete(["step-1/manifest.json", "step-1/never-there"])
    assert "step-1/manifest.json" not in storage.list()
    storage.delete(["step-1"], recursive=True)
    assert storage.list() == {}


def test_a_download_without_a_batched_copy_reads_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage_module, "PIECE_BYTES", 100)
    toy = ToyStorage(f"toy://pieces-{tmp_path.name}")
    reads: list[tuple[int, int | None]] = []
    real_get = toy.get

    def counted(key: str, *, start: int = 0, end: int | None = None) -> bytes | None:
        reads.append((start, end))
        return real_get(key, start=start, end=end)

    toy.get = counted  # type: ignore[method-assign]
    toy.put([(bytes(250), "big"), (bytes(200), "exact")])
    download(toy, [("big", tmp_path / "big"), ("exact", tmp_path / "exact")])
    assert (tmp_path / "big").stat().st_size == 250 and (tmp_path / "exact").stat().st_size == 200
    assert sorted(reads) == [(0, 100), (0, 100), (100, 200), (100, 200), (200, 300), (200, 300)]
    with pytest.raises(FileNotFoundError, match=r"toy://pieces-.*/gone does not exist"):
        download(toy, [("gone", tmp_path / "gone")])


def test_a_backend_in_one_file_holds_a_run_that_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_storage("toy", ToyStorage.open)
    monkeypatch.setattr(storage_module, "PIECE_BYTES", 4096)  # several pieces per file
    local = _train(tmp_path / "disk", tmp_path / "a", stop_at=STOP)
    local |= _train(tmp_path / "disk", tmp_path / "a", resume=True)
    url = f"toy://bucket-{tmp_path.name}/run1"
    remote = _train(url, tmp_path / "b", stop_at=STOP)
    objects = ToyStorage.stores[url]
    folder = f"step-{STOP:08d}"
    assert f"{folder}/manifest.json" in objects and f"{folder}/trainer.pt" in objects
    # Resumed on a "new machine": nothing staged, everything read back through the protocol.
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    remote |= _train(url, tmp_path / "c")
    assert remote["losses"] == local["losses"]
    assert remote["position"] == local["position"]
    assert all(torch.equal(remote["weights"][k], v) for k, v in local["weights"].items())


def test_the_manifest_is_committed_last_and_an_uncommitted_save_is_invisible(
    tmp_path: Path,
) -> None:
    register_storage("toy", ToyStorage.open)
    url = f"toy://commit-{tmp_path.name}/run"
    _train(url, tmp_path / "a", stop_at=STOP)
    objects = ToyStorage.stores[url]
    folder = f"step-{STOP:08d}"
    [(committed, present)] = ToyStorage.commits[url]
    assert committed == f"{folder}/manifest.json"
    manifest = json.loads(objects[committed])
    assert {f"{folder}/{name}" for name in manifest["files"]} | {
        f"{folder}/manifest.xxh3"
    } <= present
    # A later save that died before its commit: files, no manifest.
    objects["step-00000099/trainer.pt"] = b"half"
    objects["step-00000099/model.safetensors"] = b"half"
    resumed = _train(url, tmp_path / "b", resume=True)
    assert resumed["resumed_from"].name == folder  # the committed one, not the leftover
    # The resumed run saved nothing: the leftover is removed by the next save, not by a read.
    assert "step-00000099/trainer.pt" in objects


def test_file_urls_use_the_local_backend_and_memory_urls_the_memory_one(tmp_path: Path) -> None:
    assert isinstance(open_storage(f"file://{tmp_path}/run"), LocalStorage)
    assert isinstance(open_storage("memory://run"), MemoryStorage)
    with pytest.raises(ConfigError, match="absolute path"):
        open_storage("file://relative/run")
    with pytest.raises(ConfigError, match="takes no storage options"):
        open_storage("memory://run", {"key": "x"})


def test_a_run_on_a_file_url_commits_through_the_local_backend(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/shared/run1"
    first = _train(url, tmp_path / "a", stop_at=STOP)
    assert first["losses"]
    folder = tmp_path / "shared" / "run1" / f"step-{STOP:08d}"
    assert (folder / "manifest.json").is_file() and (folder / "manifest.xxh3").is_file()
    assert not list(folder.rglob(".put-*"))  # no temporary left behind
    resumed = _train(url, tmp_path / "b", resume=True)
    assert resumed["position"][1] > STOP
