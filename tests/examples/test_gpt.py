"""examples/gpt: nanoGPT's loop on paratrain, a tiny GPT trained on 2 gloo ranks.

Each strategy (ddp, fsdp, tp) trains until the loss falls; the final ``model.pt`` loads into a
fresh ``GPT`` with plain torch and reproduces the last validation loss the run logged; fsdp
ends at ddp's weights; a run stopped at iteration 5 and started again ends at the weights of
the uninterrupted run. Bad input (files, flags) stops either script with status 2 and one
message saying what to do, before anything is written.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from tests.examples.support import EXAMPLES, metrics, refusal, run_example, run_scripts

pytestmark = pytest.mark.examples

MAX_ITERS = 8
BLOCK, BATCH, EVAL_ITERS = 32, 8, 2
TINY = (
    "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--block-size", str(BLOCK),
    "--batch-size", str(BATCH), "--eval-interval", "4", "--eval-iters", str(EVAL_ITERS),
    "--log-interval", "1", "--lr", "1e-2", "--warmup-iters", "3",
    "--lr-decay-iters", str(MAX_ITERS), "--dropout", "0.1", "--precision", "fp32",
)  # fmt: skip
"""A model that trains in seconds on CPU ranks; the schedule ends at MAX_ITERS in every run."""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gpt_data")
    subprocess.run(
        [sys.executable, str(EXAMPLES / "gpt" / "prepare.py"), "--max-chars", "60000",
         "--out-dir", str(out)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def gpt() -> ModuleType:
    """examples/gpt/model.py, under a name no other example's model.py takes."""
    spec = importlib.util.spec_from_file_location(
        "gpt_example_model", EXAMPLES / "gpt" / "model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def train(
    run_dir: Path, data_dir: Path, strategy: str, max_iters: int = MAX_ITERS, global_batch: int = 32
) -> str:
    """Rank 0's output of ``paratrain run --nproc 2 examples/gpt/train.py``."""
    proc = run_example(
        "gpt/train.py", "--strategy", strategy, "--data-dir", str(data_dir),
        "--max-iters", str(max_iters), "--global-batch", str(global_batch), *TINY,
        run_dir=run_dir,
    )  # fmt: skip
    return proc.stdout


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("gpt_ddp") / "run"
    return run_dir, train(run_dir, data_dir, "ddp")


def evals(run_dir: Path) -> list[dict[str, Any]]:
    return [row for row in metrics(run_dir) if "val/loss" in row]


def iters_printed(output: str) -> list[int]:
    return [
        int(line.split()[1].rstrip(":")) for line in output.splitlines() if line.startswith("iter ")
    ]


def load_weights(gpt: ModuleType, run_dir: Path) -> torch.nn.Module:
    """The run's final weights in a fresh GPT, with plain torch only."""
    config = gpt.GPTConfig(**json.loads((run_dir / "model_args.json").read_text()))
    model = gpt.GPT(config)
    state = torch.load(run_dir / "model.pt", weights_only=True)
    # the tied embedding and output layer are one tensor in the file (under every strategy)
    assert state["transformer.wte.weight"] is state["lm_head.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()


@torch.no_grad()
def val_loss(model: torch.nn.Module, data_dir: Path, data_ranks: int) -> float:
    """The loss on the validation windows train.py evaluates: evenly spread starts, split into
    per-rank batches; every rank has as many, so the mean over ranks is the mean of them all."""
    data = np.fromfile(data_dir / "val.bin", dtype=np.uint16).astype(np.int64)
    count = EVAL_ITERS * BATCH * data_ranks
    starts = np.linspace(0, len(data) - BLOCK - 1, count).astype(np.int64)
    xy = torch.from_numpy(np.stack([data[i : i + BLOCK + 1] for i in starts]))
    losses = [model(b[:, :-1], b[:, 1:])[1] for b in xy.split(BATCH)]
    return float(torch.stack(losses).mean())


def check_trained(run_dir: Path, output: str, gpt: ModuleType, data_dir: Path, ranks: int) -> None:
    assert iters_printed(output) == list(range(MAX_ITERS)), output[-2000:]
    rows = evals(run_dir)
    assert [r["step"] for r in rows] == [0, 4, MAX_ITERS]
    assert rows[-1]["val/loss"] < rows[0]["val/loss"] - 0.5, rows
    assert rows[-1]["train/loss"] < rows[0]["train/loss"] - 0.5, rows
    model = load_weights(gpt, run_dir)
    assert val_loss(model, data_dir, ranks) == pytest.approx(rows[-1]["val/loss"], abs=1e-5)


def test_ddp_trains_and_its_weights_reload(
    ddp_run: tuple[Path, str], gpt: ModuleType, data_dir: Path
) -> None:
    run_dir, output = ddp_run
    assert "global batch 32 = per-rank batch 8 x world size 2 x grad_accum 2" in output
    check_trained(run_dir, output, gpt, data_dir, ranks=2)


def test_fsdp_trains_to_the_weights_of_ddp(
    tmp_path: Path, ddp_run: tuple[Path, str], gpt: ModuleType, data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    output = train(run_dir, data_dir, "fsdp")
    assert "strategy fsdp" in output
    check_trained(run_dir, output, gpt, data_dir, ranks=2)
    # Same seeds, same batches: only the order of the sums differs. The key projection's bias
    # is left out: it adds the same score to every key of a query, which softmax ignores, so
    # its gradient is rounding noise that AdamW's normalisation turns into steps of any sign.
    ddp = torch.load(ddp_run[0] / "model.pt", weights_only=True)
    fsdp = torch.load(run_dir / "model.pt", weights_only=True)
    for name, weight in ddp.items():
        if not name.endswith("attn.k_proj.bias"):
            torch.testing.assert_close(fsdp[name], weight, rtol=0, atol=1e-5, msg=name)
    x = torch.arange(2 * BLOCK).reshape(2, BLOCK) % 50  # any fixed tokens
    with torch.no_grad():
        logits = [load_weights(gpt, d)(x, x)[0] for d in (ddp_run[0], run_dir)]
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=1e-5)


def test_tp_splits_heads_and_trains(tmp_path: Path, gpt: ModuleType, data_dir: Path) -> None:
    run_dir = tmp_path / "run"
    output = train(run_dir, data_dir, "tp", global_batch=16)
    assert "transformer.h.1.attn.n_head = 1 heads per rank (of 2)" in output
    assert "transformer.h.0.mlp.c_fc ColwiseParallel" in output
    # both ranks of the tp group read the same batch: one data-parallel rank
    assert "per-rank batch 8 x data-parallel ranks 1 x grad_accum 2" in output
    check_trained(run_dir, output, gpt, data_dir, ranks=1)


def test_ddp_resume_continues_to_the_uninterrupted_weights(
    tmp_path: Path, ddp_run: tuple[Path, str], data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    first = train(run_dir, data_dir, "ddp", max_iters=5)
    assert iters_printed(first) == list(range(5))
    second = train(run_dir, data_dir, "ddp")
    assert "resumed from" in second and "step-00000005 at iter 5" in second, second[-2000:]
    assert iters_printed(second) == list(range(5, MAX_ITERS))
    # the schedule and the batches continue: every iteration's lr and loss equal the
    # uninterrupted run's (metrics.jsonl holds the rows of both attempts, in order)
    resumed_rows, straight_rows = iteration_rows(run_dir), iteration_rows(ddp_run[0])
    assert [r[:2] for r in resumed_rows] == [r[:2] for r in straight_rows]
    assert [r[2] for r in resumed_rows] == pytest.approx([r[2] for r in straight_rows], abs=1e-6)
    straight = torch.load(ddp_run[0] / "model.pt", weights_only=True)
    resumed = torch.load(run_dir / "model.pt", weights_only=True)
    for name, weight in straight.items():
        torch.testing.assert_close(resumed[name], weight, rtol=0, atol=1e-6, msg=name)


def iteration_rows(run_dir: Path) -> list[tuple[int, float, float]]:
    """(iteration, lr, loss) of every iteration the run logged."""
    return [(r["step"], r["lr"], r["loss"]) for r in metrics(run_dir) if "loss" in r]


# -- bad input ---------------------------------------------------------------------------------
PREPARE = "run examples/gpt/prepare.py"
COUNT = "pass a whole number of at least 1"
REFUSED = {  # case: (script, its arguments, the message); the `refused` fixture makes the files
    "prepare-empty": (
        "prepare.py",
        ["--input", "empty.txt"],
        "empty.txt gives 0 characters; train and val need at least one each, so "
        "--val-fraction 0.1 needs 10 or more",
    ),
    "prepare-missing": (
        "prepare.py",
        ["--input", "missing.txt"],
        "cannot read --input missing.txt: No such file or directory",
    ),
    "prepare-latin1": (
        "prepare.py",
        ["--input", "latin1.txt"],
        "--input latin1.txt is not UTF-8 text (byte 3 is 0xe9)",
    ),
    "train-no-val": ("train.py", ["--data-dir", "no_val"], f"no_val/val.bin is missing: {PREPARE}"),
    "train-empty": ("train.py", ["--data-dir", "empty"], f"empty/train.bin is empty: {PREPARE}"),
    "eval-interval": ("train.py", ["--eval-interval", "0"], f"--eval-interval: got '0'; {COUNT}"),
    "log-interval": ("train.py", ["--log-interval", "0"], f"--log-interval: got '0'; {COUNT}"),
    "eval-iters": ("train.py", ["--eval-iters", "0"], f"--eval-iters: got '0'; {COUNT}"),
    "batch-size": ("train.py", ["--batch-size", "0"], f"--batch-size: got '0'; {COUNT}"),
    "block-size": ("train.py", ["--block-size", "0"], f"--block-size: got '0'; {COUNT}"),
    "dropout": ("train.py", ["--dropout", "1.5"], "--dropout: got '1.5'; pass a number from 0"),
}


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Every REFUSED case, run four at a time (a start that imports torch takes seconds) in a
    folder that holds the bad files and nothing else."""
    root = tmp_path_factory.mktemp("gpt_bad_input")
    (root / "empty.txt").touch()
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))
    for folder in ("no_val", "empty"):
        (root / folder).mkdir()
        (root / folder / "meta.json").write_text('{"vocab_size": 1}')
    (root / "no_val" / "train.bin").write_bytes(bytes(200))  # 100 tokens, and no val.bin
    (root / "empty" / "train.bin").touch()
    (root / "empty" / "val.bin").touch()
    commands = {case: [str(EXAMPLES / "gpt" / script), *args]
                for case, (script, args, _) in REFUSED.items()}  # fmt: skip
    return root, run_scripts(commands, root)


@pytest.mark.parametrize("case", REFUSED)
def test_bad_input_stops_with_one_message(case: str, refused: tuple[Path, dict[str, Any]]) -> None:
    root, procs = refused
    assert REFUSED[case][2] in refusal(procs[case])
    # nothing written: no token files (data/gpt), no run dir (runs/paratrain)
    assert not (root / "data").exists() and not (root / "runs").exists()
