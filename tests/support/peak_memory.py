"""The peak resident memory of one ``paratrain`` command, run in a fresh process.

peak = command_peak_bytes("ckpt", "convert", "in.safetensors", "out", "--to", "hf")
"""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
import sys
from paratrain.commands.cli import main
try:
    main(sys.argv[1:])
except SystemExit as done:
    assert not done.code, done.code
hwm = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(int(hwm.split()[1]) * 1024)  # this process's own peak (ru_maxrss keeps the parent's)
"""


def command_peak_bytes(*args: str) -> int:
    """``VmHWM`` of a process that ran ``paratrain ARGS`` (which must succeed), in bytes."""
    done = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True,
                          check=True, timeout=300)  # fmt: skip
    return int(done.stdout.split()[-1])
