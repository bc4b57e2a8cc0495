"""The corpus of loop shapes and the runs that test it (``tests/resume_corpus/test_corpus.py``).

    shape = SHAPES["mnist"]
    trial = kill_trial(shape, nproc=2, tmp=tmp_path)   # uninterrupted vs killed once, restarted
    assert trial.difference is None, trial.difference

:func:`kill_trial` checks restart-safety without ``paratrain verify-resume``: it runs a script
to the end under ``paratrain run --nproc N``, then again with one rank SIGKILLed after an
optimizer step (``killer.py``) and ``--max-restarts 1``, and compares the two runs' newest
checkpoints (every tensor file, and every value in ``trainer.pt``) and the files the script
writes into its run dir. :func:`parity` runs a port and its plain-torch original in one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

CORPUS = Path(__file__).resolve().parent
KILLER = CORPUS / "killer.py"
ROOT = CORPUS.parents[1]


@dataclass(frozen=True)
class Shape:
    """One corpus script and what a restart-safety check compares."""

    name: str
    """The script is ``<name>.py``; its plain-torch original, if any, ``<name>_original.py``."""
    args: tuple[str, ...] = ()
    """Extra arguments for every run."""
    compare_files: str | None = None
    """Glob of files the script writes into its run dir, compared between runs."""
    original: bool = False
    """Has a hand-written plain-torch original for the one-process parity test."""
    restart_safe: bool = True
    """False for the deliberately broken script: a restart must change its final weights."""

    @property
    def script(self) -> Path:
        return CORPUS / f"{self.name}.py"


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("word_language_model", compare_files="best.pt", original=True),
        Shape("mnist", original=True),
        Shape("vae", compare_files="*_*.pt", original=True),
        Shape("dcgan", compare_files="net*_epoch_*.pth", original=True),
        Shape("imagenet", args=("--resume",), compare_files="best.pt", original=True),
        Shape("siamese_network", compare_files="siamese_network.pt"),
        Shape("super_resolution", compare_files="model_epoch_*.pth", original=True),
        Shape("nanogpt", original=True),
        Shape(
            "hf_clm_no_trainer",
            args=("--resume_from_checkpoint",),
            compare_files="pytorch_model.pt",
        ),
        Shape("torchtitan_train", original=True),
        Shape("multi_optimizer", original=True),
        Shape("forward_forward", original=True),
        Shape("mingpt_trainer", original=True),
        Shape("style_transfer", compare_files="*epoch_*", original=True),
        Shape("broken_untracked_counter", restart_safe=False),
    )
}


def environment(**extra: str) -> dict[str, str]:
    """This checkout's sources first, one thread per rank."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", **extra}


def paratrain_run(
    command: Sequence[str],
    run_dir: Path,
    nproc: int,
    *,
    max_restarts: int = 0,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``python -m paratrain run --nproc N [--max-restarts K] --run-dir RUN_DIR COMMAND``."""
    args = [sys.executable, "-m", "paratrain", "run", "--nproc", str(nproc), "--backend", "gloo"]
    if max_restarts:
        args += ["--max-restarts", str(max_restarts)]
    args += ["--run-dir", str(run_dir), *command]
    return subprocess.run(
        args,
        cwd=run_dir.parent,
        env=environment(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def python(
    command: Sequence[str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python COMMAND`` in ``cwd`` (one process, as a user runs a script)."""
    return subprocess.run(
        [sys.executable, *command],
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def failure(proc: subprocess.CompletedProcess[str]) -> str:
    """The end of a failed run's output, for an assertion message."""
    out, err = proc.stdout[-3000:], proc.stderr[-3000:]
    return f"exit {proc.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


# -- what a run leaves behind ---------------------------------------------------------------
def newest_checkpoint(run_dir: Path) -> Path:
    """The newest committed checkpoint: highest step, then the later of saves at one step."""

    def order(folder: Path) -> tuple[int, int]:
        step, _, again = folder.name.removeprefix("step-").partition(".")
        return int(step), int(again or 0)

    folders = [
        p for p in (run_dir / "checkpoints").glob("step-*") if (p / "manifest.json").exists()
    ]
    assert folders, f"no checkpoint in {run_dir / 'checkpoints'}"
    return max(folders, key=order)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts, lists and tuples as one ``{"a.b.0": leaf}`` dict."""
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, item in items:
        out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
    return out


def checkpoint_state(folder: Path) -> dict[str, Any]:
    """Every tensor of the checkpoint's safetensors files and every value of ``trainer.pt``."""
    state: dict[str, Any] = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update({f"{path.stem}:{k}": v for k, v in load_file(path).items()})
    trainer = torch.load(folder / "trainer.pt", weights_only=True)
    state.update({f"trainer:{k}": v for k, v in flatten(trainer).items()})
    return state


def file_state(run_dir: Path, pattern: str | None) -> dict[str, Any]:
    """The files matching ``pattern`` in the run dir, loaded (tensors compared by value)."""
    if pattern is None:
        return {}
    state: dict[str, Any] = {}
    for path in sorted(run_dir.glob(pattern)):
        loaded = torch.load(path, weights_only=True)
        state.update({f"{path.name}:{k}": v for k, v in flatten(loaded).items()})
    return state


def first_difference(expected: Mapping[str, Any], got: Mapping[str, Any]) -> str | None:
    """The first key whose value differs (tensors bit for bit), with max |a-b|; None if equal."""
    if expected.keys() != got.keys():
        missing, extra = sorted(expected.keys() - got.keys()), sorted(got.keys() - expected.keys())
        return f"keys differ: missing {missing[:5]}, unexpected {extra[:5]}"
    for key, a in expected.items():
        b = got[key]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype:
                return f"{key}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
            if not torch.equal(a, b):
                delta = (
                    (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "-"
                )
                return f"{key}: max |a-b| {delta}"
        elif type(a) is not type(b) or a != b:
            return f"{key}: {a!r} vs {b!r}"
    return None


def model_keys(difference: str) -> bool:
    """True when a difference names a model weight (a ``model*.safetensors`` tensor)."""
    return difference.startswith("model")


# -- the stopgap for verify-resume ----------------------------------------------------------
@dataclass
class Trial:
    """One script at one world size: uninterrupted against killed once and restarted."""

    shape: str
    nproc: int
    steps: int
    """Optimizer steps of the killing rank in the uninterrupted run (all optimizers)."""
    kill_step: int
    resumed_step: int | None
    """The global step the restarted attempt resumed from (restarts.jsonl)."""
    difference: str | None
    seconds: float


def kill_trial(shape: Shape, nproc: int, tmp: Path, at: float = 0.6) -> Trial:
    """Run ``shape`` uninterrupted, then killed after ``at`` of its optimizer steps on the last
    rank and restarted once; compare the newest checkpoints and ``compare_files``."""
    start = time.monotonic()
    command = [str(KILLER), str(shape.script), *shape.args]
    straight, killed = tmp / f"{shape.name}-{nproc}-straight", tmp / f"{shape.name}-{nproc}-killed"
    counts = tmp / f"{shape.name}-{nproc}-steps"
    proc = paratrain_run(command, straight, nproc, env={"CORPUS_COUNT_FILE": str(counts)})
    assert proc.returncode == 0, failure(proc)
    rank = nproc - 1
    steps = int(Path(f"{counts}.rank{rank}").read_text())
    kill_step = max(1, round(steps * at))
    env = {"CORPUS_KILL_STEP": str(kill_step), "CORPUS_KILL_RANK": str(rank)}
    proc = paratrain_run(command, killed, nproc, max_restarts=1, env=env)
    assert proc.returncode == 0, failure(proc)
    restarts = (killed / "restarts.jsonl").read_text().splitlines()
    assert len(restarts) == 1, restarts
    record = json.loads(restarts[0])
    resumed_step = record["step"] if record.get("resumed") else None
    expected = {
        **checkpoint_state(newest_checkpoint(straight)),
        **file_state(straight, shape.compare_files),
    }
    got = {**checkpoint_state(newest_checkpoint(killed)), **file_state(killed, shape.compare_files)}
    return Trial(
        shape.name,
        nproc,
        steps,
        kill_step,
        resumed_step,
        first_difference(expected, got),
        time.monotonic() - start,
    )


# -- one-process parity with the hand-written original ---------------------------------------
def parity(shape: Shape, tmp: Path) -> str | None:
    """Run the port as ``python <name>.py`` and its original as ``python <name>_original.py
    --final FILE``, one process each; the first difference between the original's saved weights
    (``{model name: state_dict}``) and the port's newest checkpoint, or None."""
    port_dir, original_dir = tmp / "port", tmp / "original"
    port_dir.mkdir()
    original_dir.mkdir()
    proc = python([str(shape.script), *shape.args], port_dir)
    assert proc.returncode == 0, failure(proc)
    final = original_dir / "final.pt"
    original = CORPUS / f"{shape.name}_original.py"
    proc = python([str(original), "--final", str(final)], original_dir)
    assert proc.returncode == 0, failure(proc)
    saved = torch.load(final, weights_only=True)
    folder = newest_checkpoint(port_dir / "runs" / "paratrain")
    expected: dict[str, Any] = {}
    got: dict[str, Any] = {}
    for path in sorted(folder.glob("model*.safetensors")):
        name = path.stem.partition(".")[2] or "model"
        got.update({f"{name}.{k}": v for k, v in load_file(path).items()})
        expected.update({f"{name}.{k}": v for k, v in saved[name].items()})
    return first_difference(expected, got)
