"""The peak memory of one ``paratrain`` command, run in a fresh process.

peak = command_peak_bytes("ckpt", "convert", "in.safetensors", "out", "--to", "hf")
anon = command_peak_bytes("ckpt", "convert", "in.pt", "out", "--to", "pt", anonymous=True)

``VmHWM`` is the kernel's own peak of the resident memory, file pages mapped from the input
included. ``anonymous=True`` samples ``RssAnon`` every millisecond instead: the memory the
process holds itself, without the input's mapped pages (clean page cache, which the kernel
drops under pressure), so a conversion that maps its input shows what it copied.
"""

from __future__ import annotations

import subprocess
import sys

_CHILD = """
import sys, threading, time
from paratrain.commands.cli import main

def status(field):
    line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024

peak, done = [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], status("RssAnon"))
        time.sleep(0.001)
sampler = threading.Thread(target=sample, daemon=True)
if sys.argv[1] == "anon":
    sampler.start()
try:
    main(sys.argv[2:])
except SystemExit as stopped:
    assert not stopped.code, stopped.code
done.set()
if sys.argv[1] == "anon":
    sampler.join()
    print(max(peak[0], status("RssAnon")))
else:
    print(status("VmHWM"))  # this process's own peak (ru_maxrss keeps the parent's)
"""


def command_peak_bytes(*args: str, anonymous: bool = False) -> int:
    """The peak memory of a process that ran ``paratrain ARGS`` (which must succeed), in bytes:
    ``VmHWM``, or with ``anonymous`` the sampled peak of ``RssAnon``."""
    kind = "anon" if anonymous else "hwm"
    done = subprocess.run([sys.executable, "-c", _CHILD, kind, *args], capture_output=True,
                          text=True, check=True, timeout=300)  # fmt: skip
    return int(done.stdout.split()[-1])
