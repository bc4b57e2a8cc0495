"""Read back what each tracker wrote, with the trackers' own readers where they have one.

    client = mlflow_client(uri)                         # mlflow.tracking.MlflowClient
    tensorboard_scalars(run_dir / "tensorboard", "loss")    # [(step, value)], as TensorBoard shows
    tensorboard_hparams(run_dir / "tensorboard")        # {"extra.lr": 0.1, ...}
    wandb_runs(run_dir)                                 # [WandbRun(id, config, history)]

wandb 0.31 has no Python reader of its ``.wandb`` files (its Go core writes them), so
:func:`wandb_records` reads the format itself: a LevelDB-style log (a 7-byte ``:W&B`` header,
32 KiB blocks of records with a 7-byte header each) of wandb's own protobuf ``Record``s.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK, HEADER = 32768, 7
FULL, LAST = 1, 4


def mlflow_client(uri: str) -> Any:
    """A client of the store at ``uri`` (a file store, which MLflow 3 opens only when asked)."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")

    return MlflowClient(tracking_uri=uri)


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """The scalar series ``tag`` as TensorBoard loads it (purged steps are gone)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def tensorboard_hparams(log_dir: Path) -> dict[str, Any]:
    """The hyper-parameters of the HParams tab (its session start info)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    events.Reload()
    found: dict[str, Any] = {}
    for content in events.PluginTagToContent("hparams").values():
        data = plugin_data_pb2.HParamsPluginData.FromString(content)
        if data.WhichOneof("data") == "session_start_info":
            for key, value in data.session_start_info.hparams.items():
                kind = value.WhichOneof("kind")
                found[key] = getattr(value, kind)
    return found


def wandb_records(path: Path) -> list[Any]:
    """Every protobuf ``Record`` of one ``run-<id>.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb log"
    pos, pending, records = HEADER, b"", []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:
            break
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            records.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return records


@dataclass
class WandbRun:
    """One local wandb run folder: its id, the config it sent, its history rows."""

    folder: Path
    id: str
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)


def wandb_runs(run_dir: Path) -> list[WandbRun]:
    """The wandb run folders under ``run_dir/wandb`` (oldest first), read back.

    ``run.finish()`` only tells wandb's service process to close the run's log; the service
    writes out its buffer some time later. Runs started in this process are read after
    ``wandb.teardown()``, which waits for the service to exit, so every record is on disk.
    """
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()
    runs = []
    for folder in sorted((run_dir / "wandb").glob("*run-*")):
        (log,) = folder.glob("run-*.wandb")
        run = WandbRun(folder, log.stem.removeprefix("run-"))
        for record in wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.config.update(_items(record.run.config.update))
            elif kind == "config":
                run.config.update(_items(record.config.update))
            elif kind == "history":
                run.history.append(_items(record.history.item))
        run.config.pop("_wandb", None)
        runs.append(run)
    return runs


def _items(items: Any) -> dict[str, Any]:
    return {".".join(i.nested_key) or i.key: json.loads(i.value_json) for i in items}
