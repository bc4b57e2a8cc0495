"""Check that a file is a real PNG image and read its size."""

import struct
from pathlib import Path


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG file; fails the test when it is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG file"
    width, height = struct.unpack(">II", head[16:24])
    return width, height
