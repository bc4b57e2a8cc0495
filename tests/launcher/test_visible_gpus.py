"""The launcher counts GPUs without importing torch on a host without GPU device nodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from paratrain.distributed.gpus import visible_gpus


def test_no_device_node_means_no_gpu_and_torch_stays_unimported(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path\n"
        "from paratrain.distributed.gpus import visible_gpus\n"
        f"print(visible_gpus(Path({str(tmp_path)!r})), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["0", "False"]


def test_a_device_node_lets_torch_answer(tmp_path: Path) -> None:
    for node in ("nvidia0", "kfd", "dxg"):
        dev = tmp_path / node
        dev.mkdir()
        (dev / node).touch()
        assert visible_gpus(dev) == torch.cuda.device_count()


def test_the_run_command_imports_no_torch_before_launching() -> None:
    code = (
        "import sys\n"
        "import paratrain.commands.run.command, paratrain.commands.run.failure\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
