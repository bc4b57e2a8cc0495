"""Every checkpoint reader on garbage: it reads the input or raises CheckpointError.

Never another exception, never a hang, never pickled code run. The inputs: random bytes (also
behind each format's magic bytes), truncations and bit flips of every supported format (torch.save
zip and legacy pickle, safetensors, each file of a paratrain checkpoint folder, DCP ``.metadata``
and data, an Accelerate folder), and hostile safetensors headers and pickles.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import paratrain as pt
from paratrain.checkpoint import inspection
from paratrain.checkpoint.loading import read_state_dict
from paratrain.errors import CheckpointError
from tests.support.training import mlp

# A deeper run: PARATRAIN_FUZZ_EXAMPLES=2000 pytest tests/checkpoint/test_fuzz.py
FUZZ = settings(
    max_examples=int(os.environ.get("PARATRAIN_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SLOW_CALL_S = 10.0


@dataclass
class Corpus:
    """Valid checkpoints of every format, written once, and a scratch folder to damage copies in."""

    root: Path
    good: Path
    marker: Path
    seeds: dict[str, Path]
    _names: Iterator[int]

    def fresh(self, suffix: str) -> Path:
        return self.root / "out" / f"{next(self._names)}{suffix}"


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def _paratrain_folder(root: Path) -> Path:
    torch.manual_seed(0)
    with pt.Run(strategy="cpu", ckpt_dir=root / "ckpts", progress=False) as run:
        model = mlp()
        run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        folder = run.save(extras={"best": 0.5})
    assert folder is not None
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    root = tmp_path_factory.mktemp("fuzz")
    (root / "out").mkdir()
    torch.manual_seed(0)
    state = mlp().state_dict()
    marker = root / "pwned"
    seeds = {"zip": root / "zip.pt", "legacy": root / "legacy.pt", "st": root / "w.safetensors"}
    torch.save(state, seeds["zip"])
    torch.save(state, seeds["legacy"], _use_new_zipfile_serialization=False)
    save_file(state, str(seeds["st"]))
    torch.save({**state, "x": _Exploit(marker)}, root / "evil.pt")
    torch.save(
        {"x": _Exploit(marker)}, root / "evil_legacy.pt", _use_new_zipfile_serialization=False
    )
    seeds |= {"evil": root / "evil.pt", "evil_legacy": root / "evil_legacy.pt"}
    dcp_save(state, checkpoint_id=str(root / "dcp"), no_dist=True)
    seeds["paratrain"] = _paratrain_folder(root)
    for kind, write in [
        ("safetensors", lambda folder: save_file(state, str(folder / "model.safetensors"))),
        ("bin", lambda folder: torch.save(state, folder / "pytorch_model.bin")),
    ]:
        folder = root / f"accelerate_{kind}"
        folder.mkdir()
        write(folder)
        torch.save({"state": {}}, folder / "optimizer.bin")
        seeds[folder.name] = folder
    seeds["dcp"] = root / "dcp"
    return Corpus(root=root, good=seeds["zip"], marker=marker, seeds=seeds, _names=count())


READERS: dict[str, Callable[[Path, Corpus], object]] = {
    "read_state_dict": lambda p, c: read_state_dict(p),
    "load_weights": lambda p, c: pt.load_weights(mlp(), p),
    "inspect": lambda p, c: inspection.inspect(p),
    "verify": lambda p, c: inspection.verify(p),
    "convert": lambda p, c: inspection.convert(p, c.fresh(".safetensors"), to="safetensors"),
    "diff": lambda p, c: inspection.diff(c.good, p),
}


def assert_every_reader_copes(path: Path, corpus: Corpus) -> None:
    """The property: each reader returns or raises CheckpointError, promptly, running no code."""
    for name, read in READERS.items():
        start = time.monotonic()
        with contextlib.suppress(CheckpointError):
            read(path, corpus)
        elapsed = time.monotonic() - start
        assert elapsed < SLOW_CALL_S, f"{name} took {elapsed:.1f}s on {path}"
        assert not corpus.marker.exists(), f"{name} ran pickled code from {path}"
    shutil.rmtree(corpus.root / "out")
    (corpus.root / "out").mkdir()


# -- damage ---------------------------------------------------------------------------------------
@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` truncated, with bits flipped, or with a run of bytes overwritten."""
    n = len(data)
    # Headers and zip directories sit at the ends: aim there as often as anywhere.
    offset = st.one_of(
        st.integers(0, min(64, n - 1)), st.integers(0, n - 1), st.integers(max(0, n - 64), n - 1)
    )
    kind = draw(st.sampled_from(["truncate", "flip", "flips", "overwrite"]))
    if kind == "truncate":
        return data[: draw(offset)]
    out = bytearray(data)
    if kind == "overwrite":
        at = draw(offset)
        junk = draw(st.binary(min_size=1, max_size=32))
        out[at : at + len(junk)] = junk
        return bytes(out[:n])
    for _ in range(1 if kind == "flip" else draw(st.integers(2, 8))):
        out[draw(offset)] ^= 1 << draw(st.integers(0, 7))
    return bytes(out)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("seed", ["zip", "legacy", "st", "evil", "evil_legacy"])
@FUZZ
@given(data=st.data())
def test_damaged_files(corpus: Corpus, seed: str, data: st.DataObject) -> None:
    original = corpus.seeds[seed].read_bytes()
    path = _write(
        corpus.root / f"damaged_{seed}{corpus.seeds[seed].suffix}", data.draw(damaged(original))
    )
    assert_every_reader_copes(path, corpus)


def _recrc(folder: Path, name: str) -> None:
    """Make the manifest agree with the damaged ``name``: damage that checksums cannot catch."""
    manifest = json.loads((folder / "manifest.json").read_text())
    data = (folder / name).read_bytes()
    manifest["files"][name] = {"crc32": zlib.crc32(data), "bytes": len(data)}
    (folder / "manifest.json").write_text(json.dumps(manifest))


FOLDER_FILES = [
    ("paratrain", "manifest.json"),
    ("paratrain", "model.safetensors"),
    ("paratrain", "optimizer.safetensors"),
    ("paratrain", "trainer.pt"),
    ("dcp", ".metadata"),
    ("dcp", "__0_0.distcp"),
    ("accelerate_safetensors", "model.safetensors"),
    ("accelerate_bin", "pytorch_model.bin"),
]


@pytest.mark.parametrize("seed,name", FOLDER_FILES)
@FUZZ
@given(data=st.data(), recrc=st.booleans())
def test_damaged_folders(
    corpus: Corpus, seed: str, name: str, data: st.DataObject, recrc: bool
) -> None:
    folder = corpus.root / f"damaged_{seed}"
    if not folder.exists():
        shutil.copytree(corpus.seeds[seed], folder)
    original = (corpus.seeds[seed] / name).read_bytes()
    _write(folder / name, data.draw(damaged(original)))
    if recrc and seed == "paratrain" and name != "manifest.json":
        _recrc(folder, name)
    try:
        assert_every_reader_copes(folder, corpus)
    finally:
        for restore in (name, "manifest.json"):
            if (corpus.seeds[seed] / restore).exists():
                shutil.copy(corpus.seeds[seed] / restore, folder / restore)


MAGIC = [b"", b"PK\x03\x04", b"PK\x05\x06", b"\x80\x02", b"\x80\x02\x8a\x0a", b"\x00" * 8 + b"{"]


@FUZZ
@given(prefix=st.sampled_from(MAGIC), body=st.binary(max_size=2048))
def test_random_bytes(corpus: Corpus, prefix: bytes, body: bytes) -> None:
    path = _write(corpus.root / "random.bin", prefix + body)
    if path.stat().st_size:  # an empty file is tested elsewhere
        assert_every_reader_copes(path, corpus)


# -- hostile safetensors headers ----------------------------------------------------------------
GOOD_ENTRY = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
BAD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "dtype": st.one_of(st.sampled_from(["F32", "BF16", "XX", "f32", "F128", ""]), st.integers()),
    "shape": st.one_of(
        st.lists(st.integers(-(2**63), 2**64), max_size=4),
        st.just([2**40, 2**40]),
        st.just("2,2"),
        st.none(),
    ),
    "data_offsets": st.one_of(
        st.lists(st.integers(-(2**63), 2**64), min_size=0, max_size=3),
        st.tuples(st.integers(0, 64), st.integers(0, 64)).map(list),
        st.just([16, 0]),
        st.just(["0", "16"]),
    ),
}


@st.composite
def hostile_safetensors(draw: st.DrawFn) -> bytes:
    """A safetensors file whose header length, JSON, entries or metadata are wrong."""
    kind = draw(st.sampled_from(["length", "not_json", "not_object", "entries", "metadata"]))
    data = draw(st.binary(min_size=0, max_size=64))
    if kind == "length":
        raw = json.dumps({"w": GOOD_ENTRY}).encode()
        n = draw(st.sampled_from([2**64 - 1, 2**63, 2**40, 100_000_001, len(raw) + 4096, 0, 1]))
        return n.to_bytes(8, "little") + raw + data
    if kind == "not_json":
        raw = b"{" + draw(st.binary(max_size=200))
    elif kind == "not_object":
        value = draw(st.sampled_from([[], [GOOD_ENTRY], 1, "w", None, True]))
        raw = json.dumps(value).encode()
    elif kind == "entries":
        entries = {
            f"t{i}": {
                key: draw(BAD_VALUES[key]) if draw(st.booleans()) else good
                for key, good in GOOD_ENTRY.items()
            }
            for i in range(draw(st.integers(1, 3)))
        }
        raw = json.dumps(entries).encode()
    else:
        meta = draw(st.sampled_from([[], "x", 1, {"a": 1}, {"a": None}, {"a": ["b"]}, {"a": {}}]))
        raw = json.dumps({"__metadata__": meta, "w": GOOD_ENTRY}).encode()
    return len(raw).to_bytes(8, "little") + raw + data


@FUZZ
@given(content=hostile_safetensors())
def test_hostile_safetensors_headers(corpus: Corpus, content: bytes) -> None:
    path = _write(corpus.root / "hostile.safetensors", content)
    assert_every_reader_copes(path, corpus)


def _safetensors(header: object, data: bytes = bytes(16), length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return (len(raw) if length is None else length).to_bytes(8, "little") + raw + data


def _entry(
    dtype: str = "F32", shape: tuple[object, ...] = (2, 2), offsets: tuple[object, ...] = (0, 16)
) -> dict[str, object]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


HOSTILE_SAFETENSORS = {
    "huge header length": _safetensors({"w": _entry()}, length=2**63),
    "header length beyond the file": _safetensors({"w": _entry()}, length=10_000),
    "header not JSON": _safetensors(b"{this is not json}"),
    "header a JSON list": _safetensors([_entry()]),
    "header a JSON string": _safetensors("w"),
    "offsets out of range": _safetensors({"w": _entry(offsets=(0, 1000))}),
    "offsets overlapping": _safetensors(
        {"a": _entry(offsets=(0, 16)), "b": _entry(offsets=(8, 24))}, bytes(24)
    ),
    "offsets negative": _safetensors({"w": _entry(offsets=(-8, 8))}),
    "offsets reversed": _safetensors({"w": _entry(offsets=(16, 0))}),
    "offsets not numbers": _safetensors({"w": _entry(offsets=("0", "16"))}),
    "unknown dtype": _safetensors({"w": _entry(dtype="F128")}),
    "shape larger than its bytes": _safetensors({"w": _entry(shape=(3, 3))}),
    "shape overflowing int64": _safetensors({"w": _entry(shape=(2**40, 2**40))}),
    "shape negative": _safetensors({"w": _entry(shape=(-2, -2))}),
    "metadata not a dict": _safetensors({"__metadata__": ["x"], "w": _entry()}),
    "metadata values not strings": _safetensors({"__metadata__": {"a": 1}, "w": _entry()}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SAFETENSORS))
def test_each_kind_of_hostile_safetensors_is_refused(corpus: Corpus, case: str) -> None:
    path = _write(corpus.root / "case.safetensors", HOSTILE_SAFETENSORS[case])
    with pytest.raises(CheckpointError, match=r"safetensors|not a checkpoint"):
        read_state_dict(path)
    assert_every_reader_copes(path, corpus)


# -- hostile pickles ----------------------------------------------------------------------------
def _text(s: str) -> bytes:
    raw = s.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def _call(module: str, name: str, *args: str) -> bytes:
    """Protocol-4 pickle ops calling ``module.name(*args)``; a dotted name reaches attributes."""
    return _text(module) + _text(name) + b"\x93" + b"".join(map(_text, args)) + b"\x85R"


def _payloads(marker: Path) -> dict[str, bytes]:
    touch = f"touch {marker}"
    path_object = _call("pathlib", "PosixPath", str(marker))
    return {
        "reduce to os.system": pickle.dumps(_Exploit(marker), protocol=2),
        "dotted name through a DCP module": b"\x80\x04"
        + _call("torch.distributed.checkpoint.filesystem", "os.system", touch)
        + b".",
        "dotted name through DCP metadata": b"\x80\x04"
        + _call("torch.distributed.checkpoint.metadata", "torch.serialization.os.system", touch)
        + b".",
        "method of an allowed class": b"\x80\x04"
        + _text("pathlib")
        + _text("PosixPath.touch")
        + b"\x93"
        + path_object
        + b"\x85R.",
    }


def _torch_zip(path: Path, pickled: bytes) -> None:
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickled)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")


def _torch_legacy(path: Path, pickled: bytes) -> None:
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

    info = {"protocol_version": PROTOCOL_VERSION, "little_endian": True, "type_sizes": {}}
    head = b"".join(pickle.dumps(x, protocol=2) for x in (MAGIC_NUMBER, PROTOCOL_VERSION, info))
    path.write_bytes(head + pickled)


def _container(kind: str, corpus: Corpus, pickled: bytes) -> Path:
    """A checkpoint of ``kind`` whose one pickle is ``pickled``."""
    base = corpus.fresh("")
    if kind == "zip":
        _torch_zip(base.with_suffix(".pt"), pickled)
        return base.with_suffix(".pt")
    if kind == "legacy":
        _torch_legacy(base.with_suffix(".pt"), pickled)
        return base.with_suffix(".pt")
    if kind == "dcp":
        shutil.copytree(corpus.seeds["dcp"], base)
        (base / ".metadata").write_bytes(pickled)
    elif kind == "accelerate":
        base.mkdir()
        _torch_zip(base / "pytorch_model.bin", pickled)
    else:  # a paratrain checkpoint whose trainer.pt is hostile, with a matching manifest
        shutil.copytree(corpus.seeds["paratrain"], base)
        _torch_zip(base / "trainer.pt", pickled)
        _recrc(base, "trainer.pt")
    return base


@pytest.mark.parametrize("kind", ["zip", "legacy", "dcp", "accelerate", "paratrain"])
def test_hostile_pickles_never_run(corpus: Corpus, kind: str, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for name, pickled in _payloads(marker).items():
        path = _container(kind, corpus, pickled)
        for reader, read in READERS.items():
            with contextlib.suppress(CheckpointError):
                read(path, corpus)
            assert not marker.exists(), f"{reader} ran {name} from a {kind} checkpoint"
        if kind != "paratrain":  # its weights are intact: only trainer.pt is hostile
            with pytest.raises(CheckpointError):
                read_state_dict(path)
