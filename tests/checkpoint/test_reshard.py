"""``paratrain ckpt reshard``: a training state rewritten offline for another layout resumes
exactly as the original checkpoint resumes in-job.

2-rank FSDP, tensor-parallel and 2-stage pipeline jobs (dropout, a shuffled loader, AdamW and
StepLR) save at step 3; `ckpt convert` gives back each one's weights as one file. Offline, the
FSDP and TP checkpoints are rewritten for one process, DDP at 2 ranks and FSDP at 2 and 4 ranks,
the pipeline's for FSDP at 2 and 4. Each world size then resumes twice for three
steps, from the original checkpoint and from the rewritten one: losses, weights, optimizer state
and the learning rate agree bit for bit. An FSDP rewrite holds the very chunks, in the very
files, that an FSDP job at that world size saves. One process: a round trip gives back every
byte, and bad input is named with nothing written.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import paratrain as pt
from paratrain.checkpoint.dcp_io import read_metadata
from paratrain.checkpoint.dcp_writer import fsdp_rows
from paratrain.checkpoint.inspection import convert, inspect
from paratrain.checkpoint.manifest import Manifest
from paratrain.checkpoint.reshard import reshard
from paratrain.checkpoint.restore import load_trainer
from paratrain.commands.cli import main
from paratrain.errors import CheckpointError
from tests.support.distributed import run_distributed
from tests.support.peak_memory import command_peak_bytes
from tests.support.saved import zip_crcs
from tests.support.training import dataset, mlp

SAVE_AT, MORE = 3, 3
TARGETS = {1: [("single", "cpu")], 2: [("fsdp", "fsdp"), ("ddp", "ddp")], 4: [("fsdp", "fsdp")]}
"""World size -> (reshard layout, strategy that resumes it)."""
SOURCES = {"fsdp": {}, "pipeline": {}, "tp": {"tp_plan": "auto"}}
"""The strategies (and settings) of the 2-rank jobs that write the checkpoints to reshard."""


def _train(ckpt: str, strategy: str, *, resume: bool) -> Any:
    """Train to SAVE_AT and save (returns the weights saved), or resume and train MORE steps."""
    settings = SOURCES.get(strategy, {})
    with pt.Run(strategy=strategy, progress=False, ckpt_dir=ckpt, seed=0, **settings) as run:
        torch.manual_seed(0)
        net = nn.Sequential(mlp(), nn.Dropout(0.3))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.8)
        model, opt = run.setup(net, opt, loss_fn=nn.functional.cross_entropy)
        loader = run.loader(dataset(40), batch_size=8 // run.data_size, shuffle=True)
        stop = SAVE_AT
        if resume:
            run.resume()
            stop = run.global_step + MORE
        losses = []
        for _ in run.epochs(4):
            for x, y in loader:
                loss = model(x, target=y)
                run.backward(loss)
                run.step(opt, sched)
                losses.append(loss.item())
                if run.global_step == stop:
                    break
            if run.global_step == stop:
                break
        if not resume:
            run.save()
            return run.strategy.full_state_dict(model)
        state = opt.state_dict()["state"]
        return {
            "losses": losses,
            "step": run.global_step,
            "weights": run.strategy.full_state_dict(model),
            "optim": {
                f"{i}.{k}": v.full_tensor() if hasattr(v, "full_tensor") else v
                for i, entries in state.items()
                for k, v in entries.items()
            },
            "lr": sched.get_last_lr(),
        }


def _newest(ckpt: str) -> Path:
    return sorted(Path(ckpt).glob("step-*"))[-1]


def _write(root: str) -> dict[str, Any]:
    return {source: _train(f"{root}/{source}", source, resume=False) for source in SOURCES}


def _resume_both(root: str, world: int) -> dict[tuple[str, str, str], Any]:
    ended = {}
    for source in SOURCES:
        for layout, strategy in _targets(source, world):
            ended[source, layout, "in-job"] = _train(f"{root}/{source}", strategy, resume=True)
            ended[source, layout, "offline"] = _train(
                f"{root}/{source}-{layout}-{world}", strategy, resume=True
            )
    if world > 1:  # what an FSDP job of this size saves, for the layout of its files
        _save_fsdp(f"{root}/saved-{world}")
    return ended


def _targets(source: str, world: int) -> list[tuple[str, str]]:
    """A pipeline's optimizer settings are per parameter: only a sharded layout holds them."""
    return [t for t in TARGETS[world] if source != "pipeline" or t[0] == "fsdp"]


def _save_fsdp(ckpt: str) -> None:
    with pt.Run(strategy="fsdp", progress=False, ckpt_dir=ckpt, seed=0) as run:
        torch.manual_seed(0)
        net = nn.Sequential(mlp(), nn.Dropout(0.3))
        model, opt = run.setup(net, torch.optim.AdamW(net.parameters(), lr=1e-2))
        run.backward(model(torch.randn(4, 6)).square().mean())
        run.step(opt)
        run.save()


def _launch(fn: Any, world: int, *args: Any) -> Any:
    if world == 1:
        return fn(*args)
    return run_distributed(fn, world, *args, timeout=300)[0]


def _layout_of(folder: Path) -> dict[tuple[str, tuple[int, ...]], tuple[tuple[int, ...], str]]:
    """(key, chunk offsets) -> (chunk sizes, file) of every tensor chunk of a DCP folder."""
    meta = read_metadata(folder / "dcp")
    layout = {}
    for key, md in meta.state_dict_metadata.items():
        for chunk in getattr(md, "chunks", []):
            info = meta.storage_data[type(next(iter(meta.storage_data)))(key, chunk.offsets)]
            layout[(key, tuple(chunk.offsets))] = (tuple(chunk.sizes), info.relative_path)
    return layout


@pytest.mark.dist
def test_offline_reshard_resumes_as_the_original_does_at_1_2_and_4_ranks(tmp_path: Path) -> None:
    root = str(tmp_path)
    saved = _launch(_write, 2, root)
    for source in SOURCES:  # every layout's model, as one file: the weights it saved
        out = tmp_path / f"{source}.safetensors"
        convert(_newest(f"{root}/{source}"), out, to="safetensors")
        weights = load_file(str(out))
        assert weights.keys() == saved[source].keys(), source
        assert all(torch.equal(weights[k], v) for k, v in saved[source].items()), source
    for source in SOURCES:
        for world in TARGETS:
            for layout, _ in _targets(source, world):
                out = Path(f"{root}/{source}-{layout}-{world}")
                reshard(_newest(f"{root}/{source}"), out, layout=layout, world=world)
    for world in TARGETS:
        ended = _launch(_resume_both, world, root, world)
        assert len(ended) == 2 * sum(len(_targets(source, world)) for source in SOURCES)
        for (source, layout, path), offline in ended.items():
            if path == "in-job":
                continue
            job, cell = ended[source, layout, "in-job"], (source, layout, world)
            assert offline["step"] == job["step"] == SAVE_AT + MORE
            assert offline["losses"] == job["losses"], cell
            assert offline["lr"] == job["lr"]
            for part in ("weights", "optim"):
                assert offline[part].keys() == job[part].keys()
                for key, value in job[part].items():
                    assert torch.equal(offline[part][key], value), (cell, part, key)
        if world > 1:  # the rewrite holds what an FSDP job of this size writes, where it does
            saved = _layout_of(_newest(f"{root}/saved-{world}"))
            rewritten = _layout_of(_newest(f"{root}/fsdp-fsdp-{world}"))
            model_chunks = {k: v for k, v in rewritten.items() if k[0].startswith("model.")}
            assert len(model_chunks) == 6 * world  # 3 layers' weights and biases, every rank
            assert model_chunks == {k: v for k, v in saved.items() if k[0].startswith("model.")}
            moments = {k: v for k, v in rewritten.items() if "exp_avg" in k[0]}
            assert moments == {k: v for k, v in saved.items() if "exp_avg" in k[0]}


# -- one process ------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A one-process checkpoint at step 3 (AdamW moments, StepLR, loader position)."""
    _train(str(tmp_path / "one"), "cpu", resume=False)
    return _newest(str(tmp_path / "one"))


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(["ckpt", "reshard", *args])
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    out = capsys.readouterr()
    return code, out.out, " ".join(out.err.split())


def test_a_round_trip_through_fsdp_gives_back_every_byte(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """one process -> FSDP at 3 ranks -> one process: the same tensors, the same trainer state,
    and no trace of the detour (the per-rank state belongs to one process again)."""
    code, out, _ = _cli([str(saved), str(tmp_path / "f3"), "--to-layout", "fsdp", "--world", "3"],
                        capsys)  # fmt: skip
    assert code == 0 and "fsdp at 3 rank(s), step 3" in out, out
    sharded = tmp_path / "f3" / saved.name
    manifest = Manifest.read(sharded)
    assert (manifest.layout, manifest.world_size, manifest.format_version) == ("sharded", 3, 7)
    assert manifest.trained == {"strategy": "cpu", "world_size": 1, "mesh": None}
    assert manifest.global_batch == 8  # the batch that trained it, not 3 ranks' worth
    assert "resharded offline" in inspect(sharded)["saved_by"]["trained_by"]
    sizes_of = read_metadata(sharded / "dcp").state_dict_metadata
    chunks = _layout_of(sharded)
    for (key, offsets), (sizes, file) in chunks.items():
        if key.startswith("model.") or "exp_avg" in key:  # FSDP's rows, each in its rank's file
            rank = int(file.split("_")[2])
            length = sizes_of[key].size[0]  # type: ignore[union-attr]
            assert (offsets[0], sizes[0]) == fsdp_rows(length, rank, 3), (key, file)
    assert {file for _, file in chunks.values()} == {f"__{r}_0.distcp" for r in range(3)}
    assert set(zip_crcs(sharded / "dcp")) == {0}  # as in-job saves: the manifest covers each block
    dcp_to_torch_save(sharded / "dcp", tmp_path / "plain.pt")  # torch alone reads it
    plain = torch.load(tmp_path / "plain.pt", weights_only=True)["model"]
    weights = load_file(str(saved / "model.safetensors"))
    assert plain.keys() == weights.keys()
    assert all(torch.equal(plain[k], weights[k]) for k in weights)
    assert _cli([str(sharded), str(tmp_path / "back"), "--to-layout", "single"], capsys)[0] == 0
    back = tmp_path / "back" / saved.name
    assert Manifest.read(back).trained is None
    for name in ("model.safetensors", "optimizer.safetensors"):
        before, after = load_file(str(saved / name)), load_file(str(back / name))
        assert before.keys() == after.keys()
        assert all(torch.equal(before[k], after[k]) for k in before), name
    before, after = load_trainer(saved), load_trainer(back)
    assert before.keys() == after.keys()
    assert before["optimizer_meta"] == after["optimizer_meta"]
    assert before["loop"] == after["loop"] and before["schedulers"] == after["schedulers"]
    pairs = zip(before["rng"], after["rng"], strict=True)
    assert all(torch.equal(a["torch"], b["torch"]) for a, b in pairs)


def test_bad_input_is_named_and_nothing_is_written(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code, _, err = _cli([str(saved), str(out), "--to-layout", "fsdp"], capsys)
    assert code == 2 and "needs --world N" in err
    code, _, err = _cli([str(saved), str(out), "--to-layout", "single", "--world", "2"], capsys)
    assert code == 2 and "--to-layout ddp --world 2" in err
    code, _, err = _cli([str(saved), str(out), "--to-layout", "tp", "--world", "2"], capsys)
    assert code == 2 and "invalid choice" in err
    code, _, err = _cli([str(tmp_path / "none"), str(out), "--to-layout", "single"], capsys)
    assert code == 2 and "is not a folder" in err
    damaged = tmp_path / "damaged" / saved.name
    damaged.parent.mkdir()
    shutil.copytree(saved, damaged)
    data = bytearray((damaged / "optimizer.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (damaged / "optimizer.safetensors").write_bytes(bytes(data))
    code, _, err = _cli([str(damaged), str(out), "--to-layout", "ddp", "--world", "2"], capsys)
    assert code == 2 and "is damaged" in err and "optimizer.safetensors" in err
    code, _, err = _cli([str(damaged.parent), str(out), "--to-layout", "ddp", "--world", "2"],
                        capsys)  # fmt: skip
    assert code == 2 and "no intact paratrain checkpoint" in err
    assert not out.exists()
    assert _cli([str(saved.parent), str(out), "--to-layout", "ddp", "--world", "2"], capsys)[0] == 0
    code, _, err = _cli([str(saved), str(out), "--to-layout", "fsdp", "--world", "2"], capsys)
    assert code == 2 and "already exists" in err
    assert [p.name for p in out.iterdir()] == [saved.name]  # no staging folder left behind
    sharded = next((out / saved.name / "dcp").glob("__1_*"), None)
    assert sharded is None  # out holds the ddp rewrite; make a sharded one to damage
    assert _cli([str(saved), str(tmp_path / "f2"), "--to-layout", "fsdp", "--world", "2"],
                capsys)[0] == 0  # fmt: skip
    shard = tmp_path / "f2" / saved.name / "dcp" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a tensor: only reading it finds the damage
    shard.write_bytes(bytes(data))
    code, _, err = _cli([str(shard.parents[1]), str(tmp_path / "f2b"), "--to-layout", "single"],
                        capsys)  # fmt: skip
    assert code == 2 and "__1_0.distcp" in err, err
    assert not (tmp_path / "f2b").exists()
    with pytest.raises(CheckpointError, match="not a number of ranks"):
        reshard(saved, tmp_path / "x", layout="fsdp", world=0)


def _peak_bytes(*args: str) -> int:
    """The memory a reshard held itself (``RssAnon``): file pages it maps are not counted."""
    return command_peak_bytes("ckpt", "reshard", *args, anonymous=True)


def _big_state(ckpt: Path, tensors: int, numel: int) -> Path:
    """A one-process checkpoint of ``tensors`` parameters of ``numel`` and their momentum."""
    params = nn.ParameterList(nn.Parameter(torch.full((numel,), float(i))) for i in range(tensors))
    with pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False) as run:
        model, opt = run.setup(params, torch.optim.SGD(params.parameters(), lr=0.1, momentum=0.9))
        run.backward(sum(p.sum() for p in model.parameters()))
        run.step(opt)
        run.save()
    return _newest(str(ckpt))


def test_a_reshard_holds_under_one_tensor_whatever_the_checkpoint_s_size(tmp_path: Path) -> None:
    """256 MiB of state (eight 16 MiB parameters and their momentum) to FSDP at 4 ranks: each
    tensor is a view of the mapped input, its pieces slices of it, so the memory the process
    holds beyond resharding a tiny checkpoint stays under one tensor (it held four when each
    tensor was read into memory, and the whole state before that)."""
    tensor = 16 * 2**20
    big = _big_state(tmp_path / "big", 8, tensor // 4)
    tiny = _big_state(tmp_path / "tiny", 1, 4)
    baseline = _peak_bytes(str(tiny), str(tmp_path / "t"), "--to-layout", "fsdp", "--world", "4")
    peak = _peak_bytes(str(big), str(tmp_path / "b"), "--to-layout", "fsdp", "--world", "4")
    assert peak - baseline < tensor, (peak - baseline) / 2**20


def _two_models(ckpt: Path, *, resume: bool) -> dict[str, torch.Tensor]:
    """A student with Adam whose learning rate is a tensor, and a teacher without optimizer."""
    with pt.Run(strategy="cpu", ckpt_dir=ckpt, progress=False, seed=0) as run:
        torch.manual_seed(0)
        student, teacher = mlp(), mlp()
        opt = torch.optim.Adam(student.parameters(), lr=torch.tensor(0.01))
        student, opt = run.setup(student, opt)
        teacher = run.setup(teacher, name="teacher")
        if resume:
            run.resume()
        else:
            run.backward(student(torch.ones(4, 6)).square().mean())
            run.step(opt)
            run.save()
        state = {f"student.{k}": v.clone() for k, v in student.state_dict().items()}
        state |= {f"teacher.{k}": v.clone() for k, v in teacher.state_dict().items()}
        state |= {f"adam.{i}.{k}": v.clone() for i, s in opt.state.items() for k, v in s.items()}
        state["lr"] = torch.as_tensor(opt.param_groups[0]["lr"]).clone()
        return state


def test_a_model_without_optimizer_and_a_tensor_learning_rate_survive_two_reshards(
    tmp_path: Path,
) -> None:
    """One process -> FSDP -> one process, with a model that has no optimizer (its empty
    optimizer file comes back) and a learning rate held as a tensor (kept as a setting)."""
    saved = _two_models(tmp_path / "one", resume=False)
    reshard(_newest(str(tmp_path / "one")), tmp_path / "fsdp", layout="fsdp", world=2)
    reshard(_newest(str(tmp_path / "fsdp")), tmp_path / "back", layout="single", world=1)
    assert (_newest(str(tmp_path / "back")) / "optimizer.teacher.safetensors").is_file()
    resumed = _two_models(tmp_path / "back", resume=True)
    assert resumed.keys() == saved.keys()
    assert all(torch.equal(resumed[k], v) for k, v in saved.items())


def test_more_ranks_than_files_a_process_may_open_is_named(
    saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An FSDP output keeps a file per rank open: beyond the hard limit, the error says how to
    raise it, and nothing is written; within it, the soft limit is raised."""
    import resource

    raised: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (64, 100))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: raised.append(limits))
    with pytest.raises(CheckpointError, match="may open only 100"):
        reshard(saved, tmp_path / "many", layout="fsdp", world=200)
    assert not (tmp_path / "many").exists() and not raised
    monkeypatch.setattr(resource, "getrlimit", lambda _: (16, 4096))
    reshard(saved, tmp_path / "some", layout="fsdp", world=8)
    assert raised == [(8 + 64, 4096)]
