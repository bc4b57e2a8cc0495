"""Hostile inputs for the verified checkpoint I/O: saved tensors viewed out of memory, block
checksums, manifests, DCP readers, and resuming from a checkpoint with a flipped byte."""

from __future__ import annotations

import builtins
import io
import json
import pickle
import shutil
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

import paratrain as pt
from paratrain.checkpoint.dcp_io import RecordingWriter, SafePlanner, SafeReader
from paratrain.checkpoint.manifest import FileRecord, Manifest
from paratrain.checkpoint.saved_tensor import saved_tensor
from paratrain.checkpoint.verified_reads import (
    BlockDigests,
    blocks_problem,
    read_blocks_verified,
    read_verified,
)
from paratrain.errors import CheckpointDamagedError, CheckpointError
from tests.support.distributed import run_distributed
from tests.support.saved import PLAIN_DTYPES, in_buffer, saved_bytes
from tests.support.training import dataset, mlp, resume_saved, save_twice, saved_once

# -- saved_tensor: equal to torch.load, inside its record, refusing the rest ---------------------


@st.composite
def strided_tensors(draw: st.DrawFn) -> torch.Tensor:
    """A view of a random storage with random size, non-negative strides and storage offset."""
    dtype = draw(st.sampled_from(PLAIN_DTYPES))
    numel = draw(st.integers(0, 40))
    base = (torch.rand(numel) * 100).to(dtype)
    dims = draw(st.integers(0, 3))
    size = draw(st.lists(st.integers(0, 4), min_size=dims, max_size=dims))
    stride = draw(st.lists(st.integers(0, 7), min_size=dims, max_size=dims))
    offset = draw(st.integers(0, numel))
    reach = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if all(size) and reach >= numel:  # would not fit: an empty view fits any storage
        size, stride, offset = [0, *size], [1, *stride], min(offset, numel)
    return base.as_strided(size, stride, offset)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype)
    return flat.copy_(tensor.reshape(-1)).view(torch.uint8)


@settings(max_examples=120, deadline=None)
@given(tensor=strided_tensors(), lead=st.integers(0, 17))
def test_any_strided_plain_tensor_reads_as_torch_load_reads_it_and_stays_in_its_record(
    tensor: torch.Tensor, lead: int
) -> None:
    data = saved_bytes(tensor)
    buffer = in_buffer(data, lead)
    got = saved_tensor(buffer, lead, len(data))
    want = torch.load(io.BytesIO(data), weights_only=True)
    assert got is not None
    assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride())
    assert torch.equal(_bits(got), _bits(want))  # bitwise: NaNs and float8 compare too
    if got.numel() and got.untyped_storage().data_ptr() == buffer.data_ptr():
        first = got.data_ptr()
        span = sum((n - 1) * s for n, s in zip(got.shape, got.stride(), strict=True))
        last = first + (span + 1) * got.element_size()
        assert buffer.data_ptr() + lead <= first and last <= buffer.data_ptr() + lead + len(data)


class _Tagged(torch.Tensor):
    pass


def _big_endian(data: bytes) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            content = source.read(info.filename)
            if info.filename.endswith("/byteorder"):
                content = b"big"
            target.writestr(info.filename, content)
    return out.getvalue()


def _deflated(data: bytes) -> bytes:
    source = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info.filename))
    return out.getvalue()


def _with_hook() -> torch.Tensor:
    t = torch.ones(3, requires_grad=True)
    t._backward_hooks = {0: print}  # what torch.save finds on a tensor with a hook
    return t


@pytest.mark.parametrize(
    "make",
    [
        lambda: saved_bytes(nn.Parameter(torch.ones(3))),
        lambda: saved_bytes(torch.ones(3).as_subclass(_Tagged)),
        lambda: saved_bytes({"w": torch.ones(3)}),
        lambda: saved_bytes((torch.ones(3),)),
        lambda: saved_bytes(None),
        lambda: _big_endian(saved_bytes(torch.arange(4, dtype=torch.int32))),
        lambda: _deflated(saved_bytes(torch.arange(4, dtype=torch.int32))),
        lambda: saved_bytes(torch.ones(2, 2).to_sparse()),
    ],
    ids=["parameter", "subclass", "dict", "tuple", "none", "big-endian", "deflated", "sparse"],
)
def test_what_is_not_a_plain_little_endian_stored_tensor_is_refused(make: Any) -> None:
    data = make()
    assert saved_tensor(in_buffer(data, 5), 5, len(data)) is None


def test_a_tensor_saved_with_backward_hooks_reads_as_torch_load_or_is_refused() -> None:
    with pytest.warns(UserWarning):  # torch.save: the hooks themselves are not saved
        data = saved_bytes(_with_hook())
    result = saved_tensor(in_buffer(data, 0), 0, len(data))
    want = torch.load(io.BytesIO(data), weights_only=False)
    assert result is None or (torch.equal(result, want.detach()) and not result.requires_grad)


def _craft(pickle_bytes: bytes, records: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", pickle_bytes)
        archive.writestr("archive/byteorder", b"little")
        archive.writestr("archive/version", b"3\n")
        for name, data in records.items():
            archive.writestr(f"archive/data/{name}", data)
    return out.getvalue()


def _push(value: object) -> bytes:
    return pickle.dumps(value, protocol=2)[2:-1]  # the opcodes without PROTO and STOP


def _rebuild(offset: int, size: tuple[int, ...], stride: tuple[int, ...], key: str = "0") -> bytes:
    storage = b"(" + _push("storage") + b"ctorch\nByteStorage\n"
    storage += _push(key) + _push("cpu") + _push(16) + b"tQ"
    args = _push(offset) + _push(size) + _push(stride) + _push(False)
    hooks = b"ccollections\nOrderedDict\n)R"
    return b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" + storage + args + hooks + b"tR."


@pytest.mark.parametrize(
    "layout",
    [
        (0, (17,), (1,)),  # one element past the record
        (16, (1,), (1,)),
        (0, (2, 2), (1,)),  # size and stride of different lengths
        (0, (2,), (1, 1)),
        (1, (4, 4), (4, 1)),
        (0, (2,), (2**62,)),
        (2**62, (1,), (1,)),
        (0, (3, 2**40), (1, 2**40)),
        (-16, (16,), (1,)),  # before its record
        (-1, (0,), (1,)),
        (2**63, (0,), (1,)),
        (0, (2**64,), (0,)),
        (0, (2**62, 4), (0, 0)),
        (0, (0, 3), (2**64, 1)),
    ],
)
def test_a_crafted_layout_reaching_past_the_record_is_refused(
    layout: tuple[int, tuple[int, ...], tuple[int, ...]],
) -> None:
    data = _craft(_rebuild(*layout), {"0": bytes(range(16))})
    assert saved_tensor(in_buffer(data, 64), 64, len(data)) is None


def test_a_storage_key_naming_a_missing_record_is_refused() -> None:
    for key in ("1", "../data.pkl", "", "0/../0"):
        data = _craft(_rebuild(0, (4,), (1,), key=key), {"0": bytes(16)})
        assert saved_tensor(in_buffer(data, 0), 0, len(data)) is None


CALLS = [
    ("builtins", "exec"),
    ("builtins", "eval"),
    ("os", "system"),
    ("torch", "load"),
    ("torch", "tensor"),
    ("torch", "from_numpy"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch.serialization", "_get_layout"),
    ("collections", "namedtuple"),
    ("torch", "FloatStorage.__init__"),
]


@pytest.mark.parametrize("module,name", CALLS)
def test_a_pickle_calling_outside_the_allow_list_runs_nothing(
    module: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: list[object] = []
    monkeypatch.setattr(builtins, "_io_attack_flag", called, raising=False)
    code = "__import__('builtins')._io_attack_flag.append(1)"
    evil = f"\x80\x02c{module}\n{name}\n".encode() + _push((code,)) + b"R."
    wrapped = evil[:-1] + b"0" + _rebuild(0, (4,), (1,))[2:]  # POP, then a valid tensor
    for body in (evil, wrapped):
        data = _craft(body, {"0": bytes(16)})
        assert saved_tensor(in_buffer(data, 3), 3, len(data)) is None
    assert called == []


# -- block checksums: what is read is verified, whatever is asked ---------------------------------


def _file(tmp_path: Path, size: int, block: int) -> tuple[Path, bytes, list[int]]:
    data = bytes((i * 7 + 3) % 251 for i in range(size))
    path = tmp_path / "shard.distcp"
    path.write_bytes(data)
    digests = [xxhash.xxh3_64_intdigest(data[i : i + block]) for i in range(0, size, block)]
    return path, data, digests


ranges = st.lists(st.tuples(st.integers(0, 400), st.integers(-3, 400)), max_size=8)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(size=st.integers(0, 300), block=st.integers(1, 70), wanted=ranges)
def test_any_wanted_ranges_give_the_file_s_bytes_where_they_were_asked(
    tmp_path: Path, size: int, block: int, wanted: list[tuple[int, int]]
) -> None:
    path, data, digests = _file(tmp_path, size, block)
    buffer = read_blocks_verified(path, size, block, digests, wanted)
    got = buffer.numpy().tobytes()
    for start, length in wanted:
        end = min(size, start + max(0, length))
        assert got[start:end] == data[start:end]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    size=st.integers(1, 300),
    block=st.integers(1, 70),
    wanted=ranges,
    flip=st.integers(0, 299),
    bit=st.integers(0, 7),
)
def test_a_flipped_bit_raises_exactly_when_its_block_is_read(
    tmp_path: Path, size: int, block: int, wanted: list[tuple[int, int]], flip: int, bit: int
) -> None:
    path, data, digests = _file(tmp_path, size, block)
    flip %= size
    raw = bytearray(data)
    raw[flip] ^= 1 << bit
    path.write_bytes(bytes(raw))
    hit = flip // block
    read = {  # the blocks covering the ranges' bytes that lie inside the file
        b
        for start, length in wanted
        if min(size, start + length) > max(0, start)
        for b in range(max(0, start) // block, (min(size, start + length) - 1) // block + 1)
    }
    before = threading.active_count()
    if hit in read:
        with pytest.raises(CheckpointDamagedError, match=r"shard\.distcp fails its checksum"):
            read_blocks_verified(path, size, block, digests, wanted)
    else:
        read_blocks_verified(path, size, block, digests, wanted)
    with pytest.raises(CheckpointDamagedError, match=r"shard\.distcp"):
        read_blocks_verified(path, size, block, digests)
    problem = blocks_problem(path, size, block, digests)
    assert problem is not None and f"bytes {hit * block}.." in problem
    assert threading.active_count() == before


@pytest.mark.parametrize("change", ["truncate", "grow", "delete", "directory"])
def test_a_resized_or_missing_file_is_named_by_every_reader(tmp_path: Path, change: str) -> None:
    path, data, digests = _file(tmp_path, 5000, 512)
    whole = xxhash.xxh3_64_intdigest(data)
    if change == "truncate":
        path.write_bytes(data[:-1])
    elif change == "grow":
        path.write_bytes(data + b"\0")
    elif change == "delete":
        path.unlink()
    else:
        path.unlink()
        path.mkdir()
    before = threading.active_count()
    for read in (
        lambda: read_blocks_verified(path, len(data), 512, digests, [(0, 10)]),
        lambda: read_blocks_verified(path, len(data), 512, digests),
        lambda: read_verified(path, "xxh3_64", whole, len(data)),
    ):
        with pytest.raises(CheckpointDamagedError, match=r"shard\.distcp"):
            read()
    assert blocks_problem(path, len(data), 512, digests) is not None
    assert threading.active_count() == before


def test_many_small_blocks_read_by_several_threads_are_all_verified(tmp_path: Path) -> None:
    path, data, digests = _file(tmp_path, 64 * 1024 + 5, 64)
    buffer = read_blocks_verified(path, len(data), 64, digests)
    assert buffer.numpy().tobytes() == data
    raw = bytearray(data)
    raw[-1] ^= 0x80  # in the last, short block of the last reader
    path.write_bytes(bytes(raw))
    before = threading.active_count()
    with pytest.raises(CheckpointDamagedError, match=f"bytes {len(data) - 5}..{len(data)}"):
        read_blocks_verified(path, len(data), 64, digests)
    assert threading.active_count() == before


def test_wrong_checksum_counts_are_damage_not_tracebacks(tmp_path: Path) -> None:
    path, _, digests = _file(tmp_path, 300, 64)
    for wrong in (digests[:-1], [*digests, 1], []):
        with pytest.raises(CheckpointDamagedError, match="block checksums"):
            read_blocks_verified(path, 300, 64, wrong)
        assert "block checksums" in (blocks_problem(path, 300, 64, wrong) or "")


# -- manifests: hostile `files` entries are CheckpointErrors ----------------------------------

BASE = {
    "format_version": 4,
    "paratrain_version": "0",
    "torch_version": "0",
    "layout": "sharded",
    "strategy": "fsdp",
    "world_size": 1,
    "per_rank_batch": 1,
    "grad_accum": 1,
    "epoch": 0,
    "step": 1,
    "samples_in_epoch": 0,
    "created": 1.0,
}

junk = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=5),
    ),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ["bytes", "xxh3_64", "crc32", "block_bytes", "blocks"]


@st.composite
def hostile_records(draw: st.DrawFn) -> object:
    kind = draw(st.sampled_from(["junk", "fields", "counts"]))
    if kind == "junk":
        return draw(junk)
    if kind == "counts":
        size = draw(st.integers(0, 10**6))
        block = draw(st.integers(-2, 10**4))
        n = draw(st.integers(0, 50))
        return {"bytes": size, "block_bytes": block, "blocks": list(range(n))}
    fields = draw(st.lists(st.sampled_from([*FIELDS, "other"]), unique=True, max_size=6))
    return {f: draw(junk) for f in fields}


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=st.text(max_size=8), record=hostile_records())
def test_hostile_file_records_are_checkpoint_errors_or_consistent(
    tmp_path: Path, name: str, record: object
) -> None:
    text = json.dumps({**BASE, "files": {name: record}})
    (tmp_path / "manifest.json").write_text(text)
    try:
        manifest = Manifest.read(tmp_path)
    except CheckpointError as err:
        assert "manifest.json" in str(err)
        return
    (got,) = manifest.files.values()
    kinds = [k for k in ("xxh3_64", "crc32", "blocks") if getattr(got, k) is not None]
    assert len(kinds) == 1 and type(got.bytes) is int and got.bytes >= 0
    if got.blocks is not None:
        assert type(got.block_bytes) is int and got.block_bytes > 0
        assert len(got.blocks) == -(-got.bytes // got.block_bytes)
        assert all(type(b) is int and 0 <= b < 2**64 for b in got.blocks)
    problem = got.problem(tmp_path / "missing-file")  # never a traceback either
    assert problem is not None and "missing" in problem


# -- DCP: every byte of a shard is checked before it is used --------------------------------------


def _small_dcp(folder: Path, block: int) -> dict[str, FileRecord]:
    torch.manual_seed(0)
    state = {"w": torch.randn(6, 5), "n": torch.tensor(7), "meta": {"a": 1, "s": "x"}}
    writer = RecordingWriter(str(folder), sync_files=True, overwrite=False)
    dcp.save(state, storage_writer=writer, no_dist=True)
    records = {}
    for name in writer.records:
        data = (folder / name).read_bytes()
        blocks = BlockDigests(block)
        blocks.update(memoryview(data))
        records[name] = FileRecord(bytes=len(data), block_bytes=block, blocks=blocks.digests())
    return records


def _blank() -> dict[str, Any]:
    return {"w": torch.zeros(6, 5), "n": torch.tensor(0), "meta": {"a": 0, "s": ""}}


@pytest.fixture(scope="module")
def small_dcp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, FileRecord]]:
    folder = tmp_path_factory.mktemp("dcp") / "good"
    return folder, _small_dcp(folder, 64)


@pytest.mark.filterwarnings("ignore::UserWarning")
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_any_flipped_bit_of_a_dcp_shard_fails_the_load(
    small_dcp: tuple[Path, dict[str, FileRecord]], tmp_path: Path, where: float, bit: int
) -> None:
    good, records = small_dcp
    bad = tmp_path / "bad"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(good, bad)
    (shard,) = [p for p in bad.iterdir() if p.suffix == ".distcp"]
    raw = bytearray(shard.read_bytes())
    raw[int(where * len(raw))] ^= 1 << bit
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointException) as caught:
        dcp.load(_blank(), storage_reader=SafeReader(str(bad), records), planner=SafePlanner())
    causes = [exc for exc, _ in caught.value.failures.values()]
    assert any(isinstance(e, CheckpointDamagedError) and shard.name in str(e) for e in causes)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_intact_dcp_shard_loads_exactly_through_the_verified_views(
    small_dcp: tuple[Path, dict[str, FileRecord]],
) -> None:
    good, records = small_dcp
    target = _blank()
    dcp.load(target, storage_reader=SafeReader(str(good), records), planner=SafePlanner())
    torch.manual_seed(0)
    assert torch.equal(target["w"], torch.randn(6, 5)) and int(target["n"]) == 7
    assert target["meta"] == {"a": 1, "s": "x"}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_shard_missing_from_the_records_is_refused(
    small_dcp: tuple[Path, dict[str, FileRecord]],
) -> None:
    good, records = small_dcp
    partial = {k: v for k, v in records.items() if not k.endswith(".distcp")}
    with pytest.raises(CheckpointException) as caught:
        dcp.load(_blank(), storage_reader=SafeReader(str(good), partial), planner=SafePlanner())
    causes = [exc for exc, _ in caught.value.failures.values()]
    assert any(isinstance(e, CheckpointDamagedError) and "manifest" in str(e) for e in causes)


# -- end to end: a flipped byte in a committed checkpoint ------------------------------------------


@pytest.fixture(scope="module")
def two_saves(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("saves") / "ck"
    save_twice(root)
    return root


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors", "trainer.pt"])
@pytest.mark.parametrize("where", [0.0, 0.5, 0.999])
def test_a_flipped_byte_in_a_replicated_file_resumes_the_previous_save(
    two_saves: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], name: str, where: float
) -> None:
    root = tmp_path / "ck"
    shutil.copytree(two_saves, root)
    target = root / "step-00000002" / name
    raw = bytearray(target.read_bytes())
    raw[int(where * (len(raw) - 1))] ^= 0x20
    target.write_bytes(bytes(raw))
    assert resume_saved(root)["step"] == 1
    said = capfd.readouterr()
    assert "skipping" in said.out + said.err and name in said.out + said.err


def test_with_every_checkpoint_damaged_resume_warns_and_starts_fresh(
    two_saves: Path, tmp_path: Path
) -> None:
    root = tmp_path / "ck"
    shutil.copytree(two_saves, root)
    for folder in root.glob("step-*"):
        path = folder / "model.safetensors"
        raw = bytearray(path.read_bytes())
        raw[-1] ^= 1
        path.write_bytes(bytes(raw))
    assert resume_saved(root)["step"] == 0  # nothing intact: skipped with warnings, a fresh start


@pytest.mark.dist
def test_a_flipped_byte_in_rank_0_s_shard_or_the_metadata_resumes_the_previous_fsdp_save(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ck"
    run_distributed(save_twice, 2, root, "fsdp")
    newest = root / "step-00000002"
    assert Manifest.read(newest).format_version == 7
    pristine = tmp_path / "pristine"
    shutil.copytree(root, pristine)
    for name in ("dcp/__0_0.distcp", "dcp/.metadata"):
        shutil.rmtree(root)
        shutil.copytree(pristine, root)
        path = newest / name
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 3] ^= 0x08
        path.write_bytes(bytes(raw))
        resumed = run_distributed(resume_saved, 2, root, "fsdp")
        assert [r["step"] for r in resumed] == [1, 1]
        err = capfd.readouterr().err
        assert "step-00000002" in err and Path(name).name in err


def test_a_record_name_stored_twice_is_left_to_torch_load() -> None:
    records = {"0": bytes(16)}
    data = _craft(_rebuild(0, (4,), (1,)), records)
    twice = io.BytesIO()
    with (
        zipfile.ZipFile(twice, "w", zipfile.ZIP_STORED) as out,
        zipfile.ZipFile(io.BytesIO(data)) as src,
    ):
        for info in src.infolist():
            out.writestr(info.filename, src.read(info.filename))
        out.writestr("archive/data/0", bytes([7]) * 16)  # readers disagree on which one counts
    blob = twice.getvalue()
    assert saved_tensor(in_buffer(blob, 64), 64, len(blob)) is None


def test_a_manifest_nested_too_deeply_is_a_checkpoint_error(tmp_path: Path) -> None:
    folder = saved_once(tmp_path)
    raw = json.loads((folder / "manifest.json").read_text())
    text = json.dumps(raw)[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (folder / "manifest.json").write_text(text)
    (folder / "manifest.xxh3").unlink()  # else its checksum, not its nesting, refuses it
    with pytest.raises(CheckpointError, match="nested too deeply"):
        Manifest.read(folder)


def _two_model_save(root: str) -> None:
    with pt.Run(strategy="fsdp", progress=False, ckpt_dir=root, seed=0) as run:
        torch.manual_seed(0)
        g, d = nn.Linear(256, 256), nn.Linear(256, 256)
        g, og = run.setup(g, torch.optim.AdamW(g.parameters(), lr=0.1), name="G")
        d, od = run.setup(d, torch.optim.AdamW(d.parameters(), lr=0.1), name="D")
        x = torch.randn(4, 256)
        run.backward(g(x).sum() + d(x).sum())
        run.step(og)
        run.step(od)
        run.save()


def _two_model_resume(root: str) -> str:
    with pt.Run(strategy="fsdp", progress=False, ckpt_dir=root, seed=0) as run:
        torch.manual_seed(0)
        g, d = nn.Linear(256, 256), nn.Linear(256, 256)
        run.setup(g, torch.optim.AdamW(g.parameters(), lr=0.1), name="G")
        run.setup(d, torch.optim.AdamW(d.parameters(), lr=0.1), name="D")
        try:
            run.resume()
        except CheckpointError as err:
            return str(err)
        return f"resumed at step {run.global_step}"


@pytest.mark.dist
def test_damage_found_after_part_of_the_state_loaded_is_an_error_not_a_fresh_start(
    tmp_path: Path,
) -> None:
    run_distributed(_two_model_save, 2, str(tmp_path))
    (folder,) = tmp_path.glob("step-*")
    shard = folder / "dcp" / "__0_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[int(len(raw) * 0.9)] ^= 0x01  # D's items, written after G's
    shard.write_bytes(bytes(raw))
    for said in run_distributed(_two_model_resume, 2, str(tmp_path)):
        assert "No intact checkpoint" in said and "cannot start fresh" in said, said


def test_a_bit_flip_anywhere_in_the_manifest_falls_back_to_the_previous_save(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pt.Run(progress=False, ckpt_dir=str(tmp_path), seed=0, keep_last=None) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        for _ in range(2):
            x, y = dataset(8)[:]
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
            run.save()
    first, second = sorted(tmp_path.glob("step-*"))
    path = second / "manifest.json"
    original = path.read_bytes()
    for position in range(0, len(original), max(1, len(original) // 40)):
        flipped = bytearray(original)
        flipped[position] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pt.Run(progress=False, ckpt_dir=str(tmp_path), seed=0) as again:
            net = mlp()
            again.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
            again.resume()
            assert again.resumed_from == first, position
        assert "skipping" in capsys.readouterr().err
    path.write_bytes(original)
