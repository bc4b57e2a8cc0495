"""DCP (FSDP) checkpoints: checksums recorded while writing, verified while loading."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import xxhash
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.checkpoint.api import CheckpointException

from paratrain.checkpoint.dcp_io import RecordingWriter, SafePlanner, SafeReader
from paratrain.checkpoint.manifest import Manifest, pack_digests
from paratrain.checkpoint.verified_reads import SHARD_BLOCK_BYTES, BlockDigests
from paratrain.errors import CheckpointDamagedError
from tests.support.distributed import run_distributed
from tests.support.saved import zip_crcs
from tests.support.training import max_abs_diff, resume_saved, save_twice, saved_once


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {
        "w": torch.randn(300, 70),
        "b": torch.randn(7, dtype=torch.float64),
        "meta": {"note": "x", "n": 3},
    }


def test_the_recording_writer_records_what_is_on_disk(tmp_path: Path) -> None:
    writer = RecordingWriter(str(tmp_path), sync_files=True, overwrite=False)
    dcp.save(_state(), storage_writer=writer, no_dist=True)
    on_disk = {p.name for p in tmp_path.iterdir()}
    assert set(writer.records) == on_disk and ".metadata" in on_disk
    for name, record in writer.records.items():
        data = (tmp_path / name).read_bytes()
        blocks = BlockDigests(SHARD_BLOCK_BYTES)
        blocks.update(memoryview(data))
        assert (record.bytes, record.block_bytes, record.blocks) == (
            len(data),
            SHARD_BLOCK_BYTES,
            blocks.digests(),
        )
        assert record.problem(tmp_path / name) is None


def test_the_verifying_reader_loads_intact_files_and_refuses_a_flipped_bit(
    tmp_path: Path,
) -> None:
    writer = RecordingWriter(str(tmp_path), sync_files=True, overwrite=False)
    dcp.save(_state(), storage_writer=writer, no_dist=True)
    checksums = writer.records
    target = {
        "w": torch.zeros(300, 70),
        "b": torch.zeros(7, dtype=torch.float64),
        "meta": {"note": "", "n": 0},
    }
    reader = SafeReader(str(tmp_path), checksums)
    dcp.load(target, storage_reader=reader, planner=SafePlanner(), no_dist=True)
    want = _state()
    assert torch.equal(target["w"], want["w"]) and torch.equal(target["b"], want["b"])
    assert target["meta"] == want["meta"]

    data = next(p for p in tmp_path.iterdir() if p.suffix == ".distcp")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    data.write_bytes(bytes(raw))
    fresh = {
        "w": torch.zeros(300, 70),
        "b": torch.zeros(7, dtype=torch.float64),
        "meta": {"note": "", "n": 0},
    }
    with pytest.raises(CheckpointException) as caught:
        dcp.load(fresh, storage_reader=SafeReader(str(tmp_path), checksums), no_dist=True)
    failures = [exc for exc, _ in caught.value.failures.values()]
    assert any(isinstance(exc, CheckpointDamagedError) for exc in failures)
    assert torch.count_nonzero(fresh["w"]) == 0  # no byte of the damaged file was used


def test_a_rank_reads_and_verifies_only_the_blocks_holding_its_items(tmp_path: Path) -> None:
    n = SHARD_BLOCK_BYTES // 4 * 2  # two blocks of float32 each
    torch.manual_seed(0)
    state = {"a": torch.randn(n), "b": torch.randn(n)}
    writer = RecordingWriter(str(tmp_path), sync_files=True, overwrite=False)
    dcp.save(state, storage_writer=writer, no_dist=True)
    (data,) = [p for p in tmp_path.iterdir() if p.suffix == ".distcp"]
    assert len(writer.records[data.name].blocks or []) >= 4
    raw = bytearray(data.read_bytes())
    raw[SHARD_BLOCK_BYTES // 2] ^= 0x10  # inside "a", written first
    data.write_bytes(bytes(raw))
    assert f"bytes 0..{SHARD_BLOCK_BYTES}" in (writer.records[data.name].problem(data) or "")

    only_b = {"b": torch.zeros(n)}  # "a"'s blocks are neither read nor needed
    dcp.load(only_b, storage_reader=SafeReader(str(tmp_path), writer.records), no_dist=True)
    assert torch.equal(only_b["b"], state["b"])
    only_a = {"a": torch.zeros(n)}
    with pytest.raises(CheckpointException) as caught:
        dcp.load(only_a, storage_reader=SafeReader(str(tmp_path), writer.records), no_dist=True)
    failures = [exc for exc, _ in caught.value.failures.values()]
    assert any(isinstance(e, CheckpointDamagedError) and "bytes 0.." in str(e) for e in failures)
    assert torch.count_nonzero(only_a["a"]) == 0


@given(
    data=st.binary(min_size=0, max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=6),
    block=st.integers(1, 64),
)
def test_block_digests_do_not_depend_on_how_the_stream_is_cut(
    data: bytes, cuts: list[int], block: int
) -> None:
    blocks = BlockDigests(block)
    edges = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    for start, end in itertools.pairwise(edges):
        blocks.update(memoryview(data)[start:end])
    want = [xxhash.xxh3_64_intdigest(data[i : i + block]) for i in range(0, len(data), block)]
    assert blocks.digests() == want


@pytest.mark.dist
def test_a_damaged_shard_of_rank_1_makes_every_rank_resume_the_previous_save(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    saved = run_distributed(save_twice, 2, str(tmp_path), "fsdp")[0]
    folders = sorted(tmp_path.glob("step-*"))
    assert [f.name for f in folders] == ["step-00000001", "step-00000002"]
    for folder in folders:  # the manifest's checksums, recorded while writing, are right
        assert Manifest.read(folder).verify(folder) == []
    shard = folders[1] / "dcp" / "__1_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 0x01
    shard.write_bytes(bytes(raw))
    resumed = run_distributed(resume_saved, 2, str(tmp_path), "fsdp")
    for rank in (0, 1):
        assert resumed[rank]["step"] == 1
    assert max_abs_diff(resumed[0]["weights"], saved[1]) == 0.0
    err = capfd.readouterr().err
    assert "step-00000002" in err and "__1_0.distcp" in err and "checksum" in err


_THREE = pack_digests([1, 2, 3])


@pytest.mark.parametrize(
    "version,record,needle",
    [
        (6, {"bytes": 10, "block_bytes": 4, "blocks": [1, 2]}, "2 block checksums for 10 bytes"),
        (6, {"bytes": 10, "blocks": [1, 2, 3]}, "without a positive block_bytes"),
        (6, {"bytes": 10, "block_bytes": 4, "blocks": [1, "x", 3]}, "64-bit checksums"),
        (6, {"bytes": 10, "block_bytes": 4, "blocks": [1, 2, 3], "xxh3_64": 5}, "exactly one"),
        (6, {"bytes": 10, "block_bytes": -4, "blocks": [1, 2, 3]}, "not a whole number"),
        (7, {"bytes": 10, "block_bytes": 4, "blocks": [1, 2, 3]}, "not text"),
        (7, {"bytes": 10, "block_bytes": 4, "blocks": "AAAA*"}, "corrupt"),
        (7, {"bytes": 10, "block_bytes": 4, "blocks": "AAAA"}, "not 8 per checksum"),
        (7, {"bytes": 10, "block_bytes": 8, "blocks": _THREE}, "3 block checksums for 10"),
    ],
)
def test_a_manifest_with_malformed_block_checksums_is_refused(
    tmp_path: Path, version: int, record: dict[str, Any], needle: str
) -> None:
    from paratrain.errors import CheckpointError

    folder = saved_once(tmp_path)
    raw = json.loads((folder / "manifest.json").read_text())
    assert raw["format_version"] == 4  # a replicated save: a few checksums per file, a list
    raw["format_version"] = version  # 7: packed, as a sharded save writes them
    for other in raw["files"].values():
        if version == 7 and "blocks" in other:
            other["blocks"] = pack_digests(other["blocks"])
    raw["files"]["dcp/__0_0.distcp"] = record
    (folder / "manifest.json").write_text(json.dumps(raw))
    (folder / "manifest.xxh3").unlink()  # as a save from before manifests had a checksum
    with pytest.raises(CheckpointError, match=needle):
        Manifest.read(folder)


def test_a_manifest_without_its_checksum_file_still_reads(tmp_path: Path) -> None:
    folder = saved_once(tmp_path)
    with_sum = Manifest.read(folder)
    (folder / "manifest.xxh3").unlink()  # a save written before the checksum file existed
    assert Manifest.read(folder) == with_sum


def test_inside_zip_crc_skipped_torch_save_writes_no_crc_and_the_setting_comes_back() -> None:
    import io
    import zipfile

    from paratrain.checkpoint.dcp_io import zip_crc_skipped

    def crcs() -> list[int]:
        buffer = io.BytesIO()
        torch.save({"w": torch.arange(100.0)}, buffer)
        return [r.CRC for r in zipfile.ZipFile(buffer).infolist()]

    assert all(crc != 0 for crc in crcs())
    with zip_crc_skipped():
        assert set(crcs()) == {0}
    assert all(crc != 0 for crc in crcs())
    with pytest.raises(RuntimeError, match="boom"), zip_crc_skipped():
        raise RuntimeError("boom")
    assert torch.serialization.get_crc32_options() is True


def test_zip_crc_skipped_leaves_other_threads_their_crcs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The script's own torch.save in another thread keeps its CRCs meanwhile; where torch's
    setting is process-wide (older releases), nothing is skipped at all."""
    import io
    import threading
    import zipfile

    from paratrain.checkpoint import dcp_io

    def crcs() -> list[int]:
        buffer = io.BytesIO()
        torch.save({"w": torch.arange(100.0)}, buffer)
        return [r.CRC for r in zipfile.ZipFile(buffer).infolist()]

    other: list[list[int]] = []
    with dcp_io.zip_crc_skipped():
        thread = threading.Thread(target=lambda: other.append(crcs()))
        thread.start()
        thread.join()
        assert set(crcs()) == {0}
    assert other and all(crc != 0 for crc in other[0])
    monkeypatch.setattr(dcp_io, "_crc_option_per_thread", lambda: False)
    with dcp_io.zip_crc_skipped():
        assert all(crc != 0 for crc in crcs())


def test_a_torch_save_file_written_without_crcs_loads_and_verifies(tmp_path: Path) -> None:
    """torch records 0 for a CRC it did not compute (set_crc32_options(False)); such a file
    is read as torch reads it, while a real CRC that fails is still refused."""
    from paratrain.checkpoint.dcp_io import zip_crc_skipped
    from paratrain.checkpoint.loading import read_state_dict
    from paratrain.errors import CheckpointError

    state = {"w": torch.arange(1000.0)}
    with zip_crc_skipped():
        torch.save(state, tmp_path / "no-crc.pt")
    back, _ = read_state_dict(tmp_path / "no-crc.pt")
    assert torch.equal(back["w"], state["w"])
    torch.save(state, tmp_path / "crc.pt")
    raw = bytearray((tmp_path / "crc.pt").read_bytes())
    raw[raw.find(state["w"].numpy().tobytes()[400:420]) + 3] ^= 0x01
    (tmp_path / "crc.pt").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="fails its CRC check"):
        read_state_dict(tmp_path / "crc.pt")


@pytest.mark.dist
def test_a_sharded_save_skips_the_zip_crc_and_plain_torch_still_loads_it(tmp_path: Path) -> None:
    """The block checksums cover every byte, so the zip CRC-32 pass (a second hash of the same
    bytes, read by nobody) is skipped: the items carry 0. torch loads them as it loads any
    DCP folder, and paratrain still views every tensor in place and checks each block."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    saved = run_distributed(save_twice, 2, str(tmp_path), "fsdp")[0]
    folder = sorted(tmp_path.glob("step-*"))[-1]
    crcs = zip_crcs(folder / "dcp")
    assert crcs and set(crcs) == {0}
    dcp_to_torch_save(folder / "dcp", tmp_path / "plain.pt")  # torch alone, no paratrain
    plain = torch.load(tmp_path / "plain.pt", weights_only=True)
    assert max_abs_diff({k: plain["model"][k] for k in saved[2]}, saved[2]) == 0.0

    from safetensors.torch import load_file

    from paratrain.checkpoint import dcp_io
    from paratrain.checkpoint.inspection import convert

    grouped: list[str] = []  # tensors read by the group reader: none, each is a mapped view
    real = dcp_io.DcpTensors.read
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dcp_io.DcpTensors, "read", lambda self, k: grouped.append(k) or real(self, k))
        convert(folder, tmp_path / "w.safetensors", to="safetensors")
    assert not grouped
    assert max_abs_diff(load_file(str(tmp_path / "w.safetensors")), saved[2]) == 0.0
