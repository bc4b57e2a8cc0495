"""``ckpt reshard`` with URLs (``s3://...``, any fsspec protocol) for its input or its output.

    reshard_urls("s3://bucket/run1", Path("local-out"), layout="fsdp", world=8)
    reshard_urls(Path("ckpts"), "s3://bucket/run1-fsdp8", layout="fsdp", world=8)
    # then: pt.Run(strategy="fsdp", ckpt_dir="s3://bucket/run1-fsdp8") on 8 ranks resumes

An input URL is a checkpoint folder or a run's checkpoint folder (its newest intact checkpoint,
tried newest name first: each is downloaded and verified before it is used). The reshard runs on
local copies in a temporary folder; an output URL then receives the new checkpoint folder as
``pt.Run(ckpt_dir=URL)`` saves one: its files first, ``manifest.xxh3``, and ``manifest.json``
last (the commit point: a reader, or the next save, takes a folder without it for an interrupted
upload and ignores it, or removes it).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from paratrain.checkpoint.backends import fetched, open_storage
from paratrain.checkpoint.inspection import remote_checkpoints_in
from paratrain.checkpoint.manifest import MANIFEST, MANIFEST_CHECKSUM, Manifest
from paratrain.checkpoint.object_storage import is_url
from paratrain.checkpoint.reshard import reshard
from paratrain.errors import CheckpointError


def reshard_urls(
    src: str | Path,
    out: str | Path,
    *,
    layout: str,
    world: int,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """:func:`~paratrain.checkpoint.reshard.reshard`, where ``src`` or ``out`` may be URLs."""
    with contextlib.ExitStack() as stack:
        local_src = stack.enter_context(_fetched(str(src))) if is_url(src) else Path(src)
        if not is_url(out):
            return reshard(local_src, Path(out), layout=layout, world=world, progress=progress)
        storage = open_storage(str(out), what="The output URL", error=CheckpointError)
        taken = {rel.split("/", 1)[0] for rel in storage.list() if rel.endswith(f"/{MANIFEST}")}
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="paratrain-reshard-")))
        result = reshard(local_src, tmp, layout=layout, world=world, progress=progress)
        final = Path(result["path"])
        if final.name in taken:
            raise CheckpointError(
                f"{storage.url.rstrip('/')}/{final.name} already exists. Give another output "
                "URL, or move it away; nothing was written."
            )
        rest = [name for name in Manifest.read(final).files if name != MANIFEST]
        storage.put([(final / name, f"{final.name}/{name}") for name in rest])
        storage.put([(final / MANIFEST_CHECKSUM, f"{final.name}/{MANIFEST_CHECKSUM}")])
        storage.commit(f"{final.name}/{MANIFEST}", (final / MANIFEST).read_bytes())
        return {**result, "path": f"{storage.url.rstrip('/')}/{final.name}"}
    raise AssertionError("unreachable")  # pragma: no cover (the with block returns)


@contextlib.contextmanager
def _fetched(url: str) -> Iterator[Path]:
    """A local copy of the checkpoint at ``url``: the folder itself, or the newest intact
    checkpoint of a run's checkpoint folder."""
    candidates = remote_checkpoints_in(url) or [url]
    problems = []
    for candidate in candidates:
        with fetched(candidate) as local:
            try:
                manifest = Manifest.read(local)
                found = manifest.verify(local)
            except CheckpointError as err:
                found = [str(err)]
            if not found:
                yield local
                return
            problems.append(f"{candidate}: {'; '.join(found)}")
    raise CheckpointError(
        f"{url} holds no intact paratrain checkpoint ({' | '.join(problems)}). Give a checkpoint "
        "folder written by pt.Run.save(), or check it with `paratrain ckpt verify`."
    )
