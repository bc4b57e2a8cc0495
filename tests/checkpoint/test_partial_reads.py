"""A rank that needs part of a stored piece (its rows of a piece saved at another world size)
reads the piece's zip records and the blocks of the elements it keeps, not the whole piece,
and every byte it uses is still verified.

The plans below are the ones DCP makes when a rank of a resumed job overlaps part of a stored
chunk: a ReadItem with ``storage_offsets`` and ``lengths`` inside the chunk. Real resumes across
world sizes (FSDP 2 -> 4 -> 3, every layout from every other) are tested with real ranks in
tests/checkpoint/test_reshard.py and tests/test_layout_matrix.py; the bytes they read are
measured by benchmarks/cross_world_reads.py.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

from paratrain.checkpoint import dcp_io, verified_reads
from paratrain.checkpoint.dcp_io import RecordingWriter, SafeReader
from paratrain.checkpoint.manifest import FileRecord
from paratrain.checkpoint.verified_reads import SHARD_BLOCK_BYTES
from paratrain.errors import CheckpointDamagedError

ROWS, COLS = 512, 256  # 512 KiB of float32: sixteen 32 KiB blocks
fast = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _saved(folder: Path) -> tuple[torch.Tensor, dict[str, FileRecord]]:
    torch.manual_seed(0)
    state = {"before": torch.randn(100_000), "w": torch.randn(ROWS, COLS), "after": torch.ones(9)}
    writer = RecordingWriter(str(folder), sync_files=True, overwrite=False)
    dcp.save(state, storage_writer=writer, no_dist=True)
    return state["w"], writer.records


def _load_part(
    folder: Path, records: dict[str, FileRecord], offsets: tuple[int, int], lengths: tuple[int, int]
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Load ``w[offsets : offsets + lengths]`` as a resuming rank does; the part and the
    (offset, bytes) of every read from the file."""
    parts, reads = _load_parts(folder, records, {"w": (offsets, lengths)})
    return parts["w"], reads


def _load_parts(
    folder: Path,
    records: dict[str, FileRecord],
    wanted: dict[str, tuple[tuple[int, int], tuple[int, int]]],
) -> tuple[dict[str, torch.Tensor], list[tuple[int, int]]]:
    """Load part ``(offsets, lengths)`` of each stored 2-D tensor named in ``wanted``."""
    reader = SafeReader(str(folder), records)
    meta = reader.read_metadata()
    reader.set_up_storage_reader(meta, is_coordinator=True)
    parts = {name: torch.full(lengths, float("nan")) for name, (_, lengths) in wanted.items()}
    planner = DefaultLoadPlanner()
    planner.set_up_planner(dict(parts), meta, is_coordinator=True)
    items = [
        ReadItem(
            type=LoadItemType.TENSOR,
            dest_index=MetadataIndex(name),
            dest_offsets=torch.Size([0, 0]),
            storage_index=MetadataIndex(name, torch.Size([0, 0])),
            storage_offsets=torch.Size(offsets),
            lengths=torch.Size(lengths),
        )
        for name, (offsets, lengths) in wanted.items()
    ]
    reads: list[tuple[int, int]] = []
    real = verified_reads._read_exactly

    def counted(fd: int, path: Path, view: memoryview, offset: int) -> None:
        reads.append((offset, view.nbytes))
        real(fd, path, view, offset)

    with mock.patch.object(verified_reads, "_read_exactly", counted):
        reader.read_data(LoadPlan(items), planner).wait()
    return parts, reads


@fast
@given(
    rows=st.tuples(st.integers(0, ROWS - 1), st.integers(1, ROWS)),
    cols=st.sampled_from([(0, COLS), (0, COLS // 2), (COLS // 4, COLS // 2)]),
)
def test_a_part_of_a_piece_reads_little_more_than_its_own_bytes(
    tmp_path_factory: pytest.TempPathFactory, rows: tuple[int, int], cols: tuple[int, int]
) -> None:
    folder = tmp_path_factory.mktemp("dcp")
    w, records = _saved(folder)
    r0, n = rows[0], min(rows[1], ROWS - rows[0])
    part, reads = _load_part(folder, records, (r0, cols[0]), (n, cols[1]))
    assert torch.equal(part, w[r0 : r0 + n, cols[0] : cols[0] + cols[1]])
    read = sum(nbytes for _, nbytes in reads)
    blocks = [
        (offset // SHARD_BLOCK_BYTES, -(-(offset + k) // SHARD_BLOCK_BYTES)) for offset, k in reads
    ]
    assert all(lo < hi for lo, hi in blocks)
    assert len({b for lo, hi in blocks for b in range(lo, hi)}) == sum(hi - lo for lo, hi in blocks)
    # The elements' span (whole rows: columns are not contiguous), plus at most the blocks
    # holding the piece's zip records (two) and one partial block at each end of the span.
    span = n * COLS * 4 if cols[1] == COLS else ((n - 1) * COLS + cols[1]) * 4
    assert read <= span + 4 * SHARD_BLOCK_BYTES
    assert read < w.nbytes or span + 4 * SHARD_BLOCK_BYTES >= w.nbytes


@pytest.mark.parametrize("probe", [16, 128])
def test_zip_records_beyond_what_was_read_make_the_whole_piece_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe: int
) -> None:
    """Where the head or tail read holds too little of the piece's zip records to find its
    layout, the parser meets zeros (never stale bytes of another window) and the whole piece
    is read and loaded."""
    monkeypatch.setattr(dcp_io, "SHARD_BLOCK_BYTES", 64)  # blocks no larger than the reads
    w, records = _saved(tmp_path)
    monkeypatch.setattr(dcp_io, "_PROBE", probe)
    part, reads = _load_part(tmp_path, records, (100, 0), (50, COLS))
    assert torch.equal(part, w[100:150])
    assert sum(n for _, n in reads) >= w.nbytes  # the whole piece: its layout was not found


def test_a_piece_s_layout_is_never_taken_from_the_bytes_of_the_window_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pieces alike, each in a window of its own, the buffer reused: the second piece's
    records are not read (too small a probe), and the first one's, left at the same place in
    the buffer, must not stand in for them."""
    monkeypatch.setattr(dcp_io, "SHARD_BLOCK_BYTES", 64)
    torch.manual_seed(1)
    state = {"a": torch.randn(ROWS, COLS), "w": torch.randn(ROWS, COLS)}
    writer = RecordingWriter(str(tmp_path), sync_files=True, overwrite=False)
    dcp.save(state, storage_writer=writer, no_dist=True)
    monkeypatch.setattr(dcp_io, "WINDOW_BYTES", 600 * 2**10)  # one piece per window
    monkeypatch.setattr(dcp_io, "_PROBE", 16)
    half = ((0, 0), (ROWS // 2, COLS))
    parts, reads = _load_parts(tmp_path, writer.records, {"a": half, "w": half})
    assert torch.equal(parts["a"], state["a"][: ROWS // 2])
    assert torch.equal(parts["w"], state["w"][: ROWS // 2])
    assert sum(n for _, n in reads) >= 2 * state["w"].nbytes  # both read whole


def test_damage_in_the_part_is_refused_and_damage_elsewhere_in_the_piece_is_never_read(
    tmp_path: Path,
) -> None:
    w, records = _saved(tmp_path)
    (data,) = tmp_path.glob("*.distcp")
    raw = bytearray(data.read_bytes())
    row = w[400].numpy().tobytes()  # the last quarter of the piece, found by its bytes
    at = bytes(raw).index(row)
    raw[at] ^= 0x01
    data.write_bytes(bytes(raw))
    part, reads = _load_part(tmp_path, records, (0, 0), (ROWS // 2, COLS))  # the first half
    assert torch.equal(part, w[: ROWS // 2])
    assert not any(offset <= at < offset + n for offset, n in reads)
    with pytest.raises(CheckpointDamagedError, match="fails its checksum"):
        _load_part(tmp_path, records, (384, 0), (128, COLS))  # the last quarter holds it
