"""``paratrain bench`` end to end on CPU with tiny sizes, and its planning and input checks."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from paratrain.commands.bench.models import MODELS, build_spec
from paratrain.commands.bench.report import markdown_table
from paratrain.commands.bench.runner import make_plan
from paratrain.commands.cli import main
from tests.support.distributed import run_distributed
from tests.support.images import png_size


@pytest.mark.parametrize("name", MODELS)
def test_builtin_models_train_a_step(name: str) -> None:
    spec = build_spec(name, width=16, depth=50 if name == "resnet" else 1, image_size=32, seq=8)
    model = spec.build()
    x, y = spec.batch(2, torch.device("cpu"))
    spec.loss(model(x), y).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_plan_skips_what_this_machine_cannot_run() -> None:
    plan = dict(make_plan(["cpu", "dp", "ddp"], ["fp32"], [1, 2]))
    reasons = {(c.strategy, c.nproc): why for c, why in plan.items()}
    assert reasons[("cpu", 1)] is None and reasons[("ddp", 2)] is None
    assert "runs in one process" in reasons[("cpu", 2)]
    assert "needs CUDA GPUs" in reasons[("dp", 1)]


def test_tp_rows_need_layers_that_auto_can_split() -> None:
    with torch.device("meta"):
        resnet = build_spec("resnet", depth=50, width=8).build()
        mlp = build_spec("mlp", width=32, depth=1).build()
    assert "finds no Linear pair" in str(make_plan(["tp"], ["fp32"], [2], resnet)[0][1])
    assert make_plan(["tp"], ["fp32"], [2], mlp)[0][1] is None


def test_two_dimensional_rows_are_meshes_of_pairs() -> None:
    from paratrain.commands.bench.loops import Config

    assert Config("hsdp", "bf16", 4).run_settings() == {
        "strategy": "fsdp",
        "mesh": {"dp_replicate": -1, "dp": 2},
        "precision": "bf16",
    }
    assert Config("fsdp_tp", "fp32", 4).run_settings()["mesh"] == {"dp": -1, "tp": 2}
    plan = {c.nproc: why for c, why in make_plan(["hsdp"], ["fp32"], [1, 3, 4])}
    assert plan[4] is None and "does not divide world size 3" in str(plan[3])
    assert "does not divide world size 1" in str(plan[1])


def test_pipeline_rows_need_a_model_paratrain_can_cut() -> None:
    with torch.device("meta"):
        gpt = build_spec("transformer", depth=2, width=64).build()
        mlp = build_spec("mlp", width=32, depth=1).build()
    assert "needs an nn.Sequential model" in str(make_plan(["pipeline"], ["fp32"], [2], gpt)[0][1])
    assert "has 8 stages but the model has 3 layers" in str(
        make_plan(["pipeline"], ["fp32"], [8], mlp)[0][1]
    )
    assert make_plan(["pipeline"], ["fp32"], [2], mlp)[0][1] is None


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--strategies", "nope"], "cpu, single, dp, ddp, fsdp, tp, pipeline, fsdp_tp, hsdp"),
        (["--nproc", "one"], "'one' is not a whole number"),
        (["--precision", "fp8"], "comma list of: fp32, bf16, fp16"),
        (["--model", "nosuchmodule:factory"], "cannot import"),
        (["--steps", "0"], "argument --steps: 0 must be from 1 to 1000000"),
        (["--compare", "deepspeed"], "comma list of: accelerate, fabric"),
    ],
)
def test_bad_input(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", *args])
    assert info.value.code == 2 and needle in capsys.readouterr().err.replace("\n", " ")


@pytest.mark.dist
@pytest.mark.e2e
def test_bench_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "--model",
            "mlp",
            "--width",
            "32",
            "--depth",
            "1",
            "--strategies",
            "cpu,dp,ddp,tp,pipeline,fsdp_tp",
            "--nproc",
            "1,2",
            "--steps",
            "4",
            "--warmup",
            "1",
            "--rounds",
            "2",
            "--budget",
            "3",
            "--batch-size",
            "8",
            "--run-dir",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert (
        "| ddp | fp32 | contiguous | 2 |" in out and "skipped: strategy 'dp' needs CUDA GPUs" in out
    )
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["meta"]["model"]["name"] == "mlp" and data["meta"]["flops_per_sample"] > 0
    rows = {(r["strategy"], r["nproc"]): r for r in data["results"]}
    names = ("cpu", "dp", "ddp", "tp", "pipeline", "fsdp_tp")
    assert set(rows) == {(s, n) for s in names for n in (1, 2)}
    assert "does not divide world size 1" in rows[("fsdp_tp", 1)]["skipped"]  # tp 2: 2 ranks
    for row in (rows[("tp", 2)], rows[("pipeline", 2)], rows[("fsdp_tp", 2)]):
        assert row["samples_per_s"] > 0 and row["overhead_ratio"] > 0
    ddp2 = rows[("ddp", 2)]
    for key in (
        "samples_per_s",
        "reference_samples_per_s",
        "overhead_ratio",
        "step_ms_p50",
        "step_ms_p90",
        "scaling_efficiency",
        "model_tflops",
        "measured_peak_tflops",
        "mfu_measured",
    ):
        assert ddp2[key] > 0, key
    assert ddp2["layout"] == "contiguous" and ddp2["block_steps"] >= 1
    assert len(ddp2["peak_memory_mb"]) == 2 and min(ddp2["peak_memory_mb"]) > 10
    assert ddp2["step_ms_p90"] >= ddp2["step_ms_p50"]
    assert "skipped" in rows[("cpu", 2)] and "skipped" in rows[("dp", 1)]
    for name in ("throughput_vs_ranks.png", "memory_per_rank.png"):
        width, height = png_size(tmp_path / name)
        assert width > 400 and height > 200


def test_loader_data_and_profile_in_one_process(tmp_path: Path) -> None:
    from paratrain.commands.bench.loops import Config, Settings
    from paratrain.commands.bench.measure import measure_config
    from paratrain.commands.bench.profile import profile_one

    margs = {"name": "mlp", "width": 16, "depth": 1}
    settings = Settings(batch_size=4, steps=3, warmup=1, rounds=2, data="loader", budget_s=2)
    stats = measure_config(build_spec(**margs), Config("cpu", "fp32", 1), settings)
    assert stats["samples_per_s"] > 0 and stats["reference_samples_per_s"] > 0
    assert stats["ratio_low"] <= stats["overhead_ratio"] <= stats["ratio_high"]
    trace_dir = profile_one("cpu", "fp32", margs, settings, tmp_path)
    traces = list(trace_dir.glob("*.pt.trace.json"))
    assert traces and json.loads(traces[0].read_text())["traceEvents"]


def test_transformer_width_must_split_into_heads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--model", "transformer", "--width", "129"])
    assert info.value.code == 2 and "multiple of 2" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "cnn", "--image-size", "2"], "does not run at these sizes"),
        (["--model", "mlp", "--width", "65536", "--depth", "1024"], "more than this machine's"),
        (["--model", "cnn", "--image-size", "5000"], "must be from 1 to 4096"),
        (["--strategies", "cpu,"], "has an empty entry"),
        (["--strategies", ""], "has an empty entry"),
    ],
)
def test_sizes_are_checked_before_any_rank_starts(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", *args, "--nproc", "1", "--steps", "1", "--rounds", "1"])
    err = capsys.readouterr().err.replace("\n", " ")
    assert info.value.code == 2 and needle in err and "Traceback" not in err


def test_pairs_are_added_until_the_interval_is_tight_or_the_budget_is_spent() -> None:
    from paratrain.commands.bench.loops import Config, Settings
    from paratrain.commands.bench.measure import measure_config

    spec = build_spec(name="mlp", width=16, depth=1)
    loose = Settings(batch_size=4, steps=2, warmup=1, rounds=5, data="synthetic", spread=100.0)
    stats = measure_config(spec, Config("cpu", "fp32", 1), loose)
    assert stats["pairs"] == 5 and not stats["noisy"]  # any interval is within ±10000 %
    strict = Settings(
        batch_size=4, steps=2, warmup=1, rounds=2, data="synthetic", spread=1e-9, budget_s=1.0
    )
    stats = measure_config(spec, Config("cpu", "fp32", 1), strict)
    assert stats["noisy"] and stats["pairs"] > 2  # it kept adding pairs, then said so
    row = {"strategy": "cpu", "precision": "fp32", "nproc": 1, **stats}
    assert "too noisy" in markdown_table([row])


def test_the_median_interval_is_seeded_and_brackets_the_median() -> None:
    from paratrain.commands.bench.measure import median_interval

    ratios = [0.97, 1.0, 1.01, 0.99, 1.02, 1.0, 0.98, 1.03]
    low, high = median_interval(ratios)
    assert (low, high) == median_interval(ratios)  # every rank computes the same
    assert low <= statistics.median(ratios) <= high and high - low < 0.06
    assert median_interval([1.0] * 6) == (1.0, 1.0)


@pytest.mark.dist
def test_peers_are_measured_in_the_same_rounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "bench",
            *("--model", "mlp", "--width", "16", "--depth", "1", "--strategies", "ddp"),
            *("--nproc", "1,2", "--steps", "3", "--warmup", "1", "--rounds", "3"),
            *("--budget", "2", "--spread", "1", "--batch-size", "8"),
            *("--compare", "accelerate,fabric"),
            *("--run-dir", str(tmp_path)),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "| accelerate/reference |" in out and "| fabric/reference |" in out
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["meta"]["settings"]["compare"] == ["accelerate", "fabric"]
    for row in data["results"]:
        assert row["overhead_ratio"] > 0 and row["pairs"] >= 2  # paratrain's keys stay
        assert row["pairs"] >= 3 or row["out_of_time"]  # the 2 s budget may end the rounds
        assert set(row["peers"]) == {"accelerate", "fabric"}
        for name, peer in row["peers"].items():
            assert peer["samples_per_s"] > 0, (name, row["nproc"])
            # 2-3 rounds on a busy machine give wide intervals; ordered and finite is the check
            assert 0 < peer["ratio_low"] <= peer["ratio"] <= peer["ratio_high"] < 1e4, name
    width, _ = png_size(tmp_path / "throughput_vs_ranks.png")
    assert width > 400


def _distance_to_reference(nproc: int, steps: int) -> dict[str, float]:
    """Every loop's largest parameter difference to the reference after ``steps`` steps."""
    import contextlib

    from paratrain.commands.bench.loops import Config, Settings
    from paratrain.commands.bench.measure import paratrain_loop, reference_loop
    from paratrain.commands.bench.peers import PEERS, start_peers

    spec = build_spec("mlp", width=16, depth=1)
    settings = Settings(batch_size=4, steps=1, warmup=1, rounds=1, data="synthetic")
    config = Config("ddp", "fp32", nproc)
    with contextlib.ExitStack() as stack:
        ours = paratrain_loop(spec, config, settings)
        stack.callback(ours.close)
        ref = reference_loop(spec, config, settings)
        peers, skipped = start_peers(PEERS, spec, config, settings, stack)  # 1 warm-up step
        assert not skipped, skipped
        for loop in (ours, ref):
            loop.step(*next(loop.batches))
        loops = {"paratrain": ours, **peers}
        for loop in (ref, *loops.values()):
            for _ in range(steps):
                loop.step(*next(loop.batches))
        torch.manual_seed(0)
        start = list(spec.build().parameters())
        want = [p.detach() for p in ref.parameters()]
        distances = {
            name: max(
                (p.detach() - w).abs().max().item()
                for p, w in zip(loop.parameters(), want, strict=True)
            )
            for name, loop in loops.items()
        }
        distances["reference moved"] = max(
            (w - s).abs().max().item() for w, s in zip(want, start, strict=True)
        )
        return distances


@pytest.mark.dist
@pytest.mark.parametrize("nproc", [1, 2])
def test_peers_train_the_same_model_as_the_reference(nproc: int) -> None:
    for distances in run_distributed(_distance_to_reference, nproc, nproc, 3):
        assert distances.pop("reference moved") > 1e-4  # the steps did change the weights
        assert distances.keys() == {"paratrain", "accelerate", "fabric"}
        assert all(d <= 1e-6 for d in distances.values()), distances


def test_a_missing_peer_package_is_named_before_any_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    gone = {"lightning", "lightning_fabric"}
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name in gone else real(name, *a)
    )
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["bench", "--compare", "accelerate,fabric", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.replace("\n", " ")
    assert info.value.code == 2 and "Traceback" not in err
    assert "--compare fabric needs lightning-fabric" in err
    assert "pip install 'paratrain[bench]'" in err and not run_dir.exists()


def test_peers_say_which_configurations_they_cannot_run() -> None:
    from paratrain.commands.bench.loops import Config, Settings
    from paratrain.commands.bench.peers import PeerSkipped, accelerate_loop, fabric_loop

    spec = build_spec("mlp", width=16, depth=1)
    settings = Settings(batch_size=4, steps=1, warmup=1, rounds=1, data="synthetic")
    with pytest.raises(PeerSkipped, match=r"no nn\.DataParallel mode"):
        accelerate_loop(spec, Config("dp", "fp32", 1), settings)
    if not torch.cuda.is_available():
        with pytest.raises(PeerSkipped, match="FSDP only on GPUs"):
            fabric_loop(spec, Config("fsdp", "fp32", 2), settings)
        with pytest.raises(PeerSkipped, match="no fp16 mixed precision on CPU"):
            fabric_loop(spec, Config("cpu", "fp16", 1), settings)


def test_peer_columns_appear_only_when_peers_were_compared() -> None:
    row = {
        "strategy": "ddp",
        "precision": "fp32",
        "nproc": 2,
        "samples_per_s": 100.0,
        "reference_samples_per_s": 101.0,
        "overhead_ratio": 1.01,
        "ratio_low": 1.0,
        "ratio_high": 1.02,
        "step_ms_p50": 1.0,
        "step_ms_p90": 1.2,
        "peak_memory_mb": [50.0, 50.0],
    }
    assert "reference |" not in markdown_table([row]).splitlines()[0].split("interval)")[1]
    peers = {
        "accelerate": {"skipped": "no FSDP on cpu"},
        "fabric": {
            "samples_per_s": 90.0,
            "ratio": 0.891,
            "ratio_low": 0.85,
            "ratio_high": 0.93,
            "noisy": True,
        },
    }
    table = markdown_table([{**row, "peers": peers}])
    assert "| accelerate samples/s | accelerate/reference | fabric samples/s |" in table
    assert "| skipped: no FSDP on cpu |  | 90.0 | 0.891 (0.850–0.930) too noisy |" in table


def test_the_allocator_is_held_steady_for_measurements() -> None:
    """glibc here: the thresholds are fixed (the bench's ratios depend on it, see measure.py)."""
    import platform

    from paratrain.commands.bench.measure import steady_allocator

    assert steady_allocator() is (platform.libc_ver()[0] == "glibc")


def test_blocks_shrink_to_fit_the_budget() -> None:
    from paratrain.commands.bench.loops import Settings
    from paratrain.commands.bench.measure import block_steps

    settings = Settings(32, steps=20, warmup=10, rounds=8, data="synthetic", budget_s=60)
    assert block_steps(settings, elapsed_s=5.0, step_s=0.001, loops=2) == 20  # fits as asked
    assert block_steps(settings, elapsed_s=10.0, step_s=1.5, loops=2) == 2  # 50 s / 16 / 1.5
    assert block_steps(settings, elapsed_s=59.0, step_s=1.5, loops=4) == 1  # one step at least
    assert block_steps(settings, elapsed_s=90.0, step_s=1.5, loops=4) == 1


def test_conv_models_run_channels_last_on_a_gpu_only_unless_asked() -> None:
    import torch

    from paratrain.commands.bench.loops import Settings
    from paratrain.commands.bench.measure import memory_format
    from paratrain.commands.bench.models import build_spec

    cnn = build_spec("cnn", width=8, depth=1, image_size=8)
    mlp = build_spec("mlp", width=8, depth=1)
    auto = Settings(8, steps=2, warmup=1, rounds=2, data="synthetic")
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert memory_format(cnn, auto, gpu) == "channels_last"
    assert memory_format(cnn, auto, cpu) == "contiguous"
    assert memory_format(mlp, auto, gpu) == "contiguous"
    off = Settings(8, steps=2, warmup=1, rounds=2, data="synthetic", memory_format="contiguous")
    assert memory_format(cnn, off, gpu) == "contiguous"


def test_a_dataset_too_large_for_memory_names_the_flag() -> None:
    from paratrain.commands.bench.models import build_spec, check_model
    from paratrain.errors import ConfigError

    spec = build_spec("resnet", width=8, depth=50, image_size=224)
    with pytest.raises(ConfigError, match="--epoch-batches"):
        check_model(spec, 64, data_samples=64 * 10**5)
    check_model(build_spec("mlp", width=8, depth=1), 32, data_samples=32 * 45)
