"""Install torch into the Makefile's virtual environment: the CPU build on a machine without an
NVIDIA GPU, the default (CUDA) build on one with a GPU.

    python tools/install_torch.py .venv/bin/python "torch==2.13.0"     # what `make` runs
    python tools/install_torch.py .venv/bin/python "torch==2.13.0" --dry-run [--gpu | --no-gpu]

PyPI's Linux wheels of torch carry CUDA (several GB). Without a GPU this asks PyTorch's CPU wheel
index first and, when that index cannot be reached or has no matching wheel, installs from the
default index instead, saying so. With a GPU, or with ``--no-cpu-index``, only the default index
is asked. The commands are printed before they run; ``--dry-run`` prints them and stops.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def has_nvidia_gpu() -> bool:
    """Whether this machine shows an NVIDIA GPU: a device node of the driver, or ``nvidia-smi -L``
    listing one."""
    if any(Path("/dev").glob("nvidia[0-9]*")):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "GPU" in done.stdout


def commands(python: str, spec: str, *, gpu: bool, cpu_index: bool = True) -> list[list[str]]:
    """The pip commands to try in order; the first that succeeds installs torch.

    >>> commands(".venv/bin/python", "torch==2.13.0", gpu=False)[0][-3:]
    ['--index-url', 'https://download.pytorch.org/whl/cpu', 'torch==2.13.0']
    >>> commands(".venv/bin/python", "torch==2.13.0", gpu=True)
    [['.venv/bin/python', '-m', 'pip', 'install', '-q', 'torch==2.13.0']]
    """
    default = [python, "-m", "pip", "install", "-q", spec]
    if gpu or not cpu_index:
        return [default]
    # One quick try of the CPU index (no retries: an unreachable index should cost seconds), the
    # default index after it. pip's own extra indexes and find-links still apply to both.
    cpu = [python, "-m", "pip", "install", "-q", "--retries", "0", "--timeout", "15"]
    return [[*cpu, "--index-url", CPU_INDEX, spec], default]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("python", help="the interpreter of the virtual environment")
    parser.add_argument("spec", help='the requirement, e.g. "torch==2.13.0"')
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--gpu", dest="gpu", action="store_true", default=None, help="as with a GPU")
    gpu.add_argument("--no-gpu", dest="gpu", action="store_false", help="as without a GPU")
    parser.add_argument(
        "--no-cpu-index", action="store_true", help="ask only the default index, GPU or not"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    found = has_nvidia_gpu() if args.gpu is None else args.gpu
    tries = commands(args.python, args.spec, gpu=found, cpu_index=not args.no_cpu_index)
    if args.dry_run:
        for command in tries:
            print(" ".join(command))
        return 0
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for number, command in enumerate(tries):
        print("install_torch:", " ".join(command), flush=True)
        if subprocess.run(command, env=env).returncode == 0:
            return 0
        if number + 1 < len(tries):
            print(
                f"install_torch: {CPU_INDEX} gave no {args.spec}; installing it from the "
                "default index instead (on Linux that is the CUDA build, several GB)",
                flush=True,
            )
    print(f"install_torch: pip could not install {args.spec}; see its message above", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
