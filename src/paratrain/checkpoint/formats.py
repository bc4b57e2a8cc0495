"""The checkpoint formats paratrain reads and writes, named once; imports nothing heavy.

    if to not in FORMATS: ...                     # targets of `paratrain ckpt convert --to`
    raise CheckpointError(f"{path} is not a checkpoint. {ACCEPTED}")
    try: parse(untrusted) except MALFORMED as err: ...

Both the CLI parser (which must import fast) and the readers use these names, so they live here
rather than in either.
"""

from __future__ import annotations

import pickle
import struct
import zipfile
import zlib

FORMATS = ("pt", "safetensors", "dcp", "hf")
"""Targets of ``paratrain ckpt convert --to`` (``hf``: a folder of size-capped safetensors shards
and ``model.safetensors.index.json``, as Hugging Face's ``save_pretrained`` writes)."""

ACCEPTED = (
    "paratrain reads torch.save files (.pt/.pth/.bin/.ckpt, zip or legacy pickle; plain, nested "
    "or Lightning state dicts), .safetensors files, and paratrain, DCP "
    "(torch.distributed.checkpoint), Accelerate or Hugging Face (sharded safetensors with "
    "model.safetensors.index.json) checkpoint folders."
)
"""What a path given to a reader may be; ends every "this is not a checkpoint" message."""

MALFORMED = (
    pickle.UnpicklingError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    struct.error,
    EOFError,
    OSError,
    KeyError,
    IndexError,
    ValueError,
    TypeError,
    AttributeError,
    OverflowError,
    MemoryError,
    RecursionError,
    NotImplementedError,
    AssertionError,
)
"""What parsers (the unpicklers, ``zipfile``, torch's loaders) raise on malformed or hostile bytes.

Caught only directly around such a parser call, where any of them means "the file is damaged or
is not what it claims", never around paratrain's own logic (a bug there must stay a traceback).
``RuntimeError`` is not listed: torch raises it for too many unrelated things; callers that know
it comes from the file add it themselves.
"""


def describe(err: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters: parsers can be verbose).

    A first line that ends with ``:`` only announces the reason (botocore's "Parameter validation
    failed:"), so the lines after it are kept too, joined, up to 600 characters."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{type(err).__name__}: {' '.join(lines)[:600]}"
    return f"{type(err).__name__}: {lines[0][:300]}"
