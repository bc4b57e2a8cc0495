"""Checkpoints on object storage, against a real S3 API (moto on loopback): what a local disk
guarantees holds for ``ckpt_dir="s3://..."`` too."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import paratrain as pt
from paratrain.commands.cli import main
from paratrain.errors import ConfigError
from tests.support.s3 import Bucket
from tests.support.training import dataset, mlp

STOP = 7  # mid-epoch 1: 24 samples / 4 per batch = 6 steps per epoch


def _train(
    ckpt_dir: str | Path, run_dir: Path, *, stop_at: int | None = None, resume: bool = False
) -> dict[str, Any]:
    """Train 2 epochs (saving at ``stop_at`` and stopping there); return what a resume must
    reproduce: losses, weights, optimizer state, loop position."""
    with pt.Run(
        strategy="cpu", progress=False, seed=0, ckpt_dir=ckpt_dir, run_dir=run_dir, keep_last=2
    ) as run:
        net = nn.Sequential(mlp(), nn.Dropout(0.2))  # dropout: the RNG state matters
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        model, opt = run.setup(net, opt, scheduler=sched)
        loader = run.loader(dataset(24), batch_size=4)
        if resume:
            assert run.resume() == {"note": "hi"}
        losses = []
        for _ in run.epochs(2):  # after a restart the first loop action resumes by itself
            for x, y in loader:
                with run.accumulate(model):
                    loss = nn.functional.cross_entropy(model(x), y)
                    run.backward(loss)
                run.step(opt, sched)
                losses.append(loss.item())
                if run.global_step == stop_at:
                    run.save(extras={"note": "hi"})
                    return {"losses": losses}
        return {
            "losses": losses,
            "weights": run.unwrap(model).state_dict(),
            "optim": opt.state_dict(),
            "position": (run.epoch, run.global_step),
            "extras": run.extras,
            "resumed_from": run.resumed_from,
        }


def test_resume_from_s3_equals_resume_from_disk(
    s3: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    local = _train(tmp_path / "disk", tmp_path / "a", stop_at=STOP)
    local |= _train(tmp_path / "disk", tmp_path / "a", resume=True)
    url = s3.url("run1")
    remote = _train(url, tmp_path / "b", stop_at=STOP)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a torchrun restart on a new machine
    remote |= _train(url, tmp_path / "c")
    assert remote["losses"] == local["losses"]
    assert remote["position"] == local["position"] and remote["extras"] == {"note": "hi"}
    assert all(torch.equal(remote["weights"][k], v) for k, v in local["weights"].items())
    assert remote["optim"]["param_groups"] == local["optim"]["param_groups"]
    for index, entry in local["optim"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(remote["optim"]["state"][index][key], value)
    out = capsys.readouterr().out
    assert f"fetched {url}/step-{STOP:08d}" in out
    assert remote["resumed_from"].is_relative_to(tmp_path / "c" / ".ckpt-staging")
    # The objects: one committed folder, every file of it, the manifest pair included.
    assert s3.folders("run1") == [f"step-{STOP:08d}"]
    names = [key.rsplit("/", 1)[1] for key in s3.keys("run1/")]
    assert sorted(names) == sorted(
        [
            "manifest.json",
            "manifest.xxh3",
            "model.safetensors",
            "optimizer.safetensors",
            "trainer.pt",
        ]
    )


def _save_steps(url: str, run_dir: Path, steps: int, **settings: Any) -> dict[int, Any]:
    weights = {}
    with pt.Run(strategy="cpu", progress=False, ckpt_dir=url, run_dir=run_dir, **settings) as run:
        net = mlp()
        model, opt = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        x, y = dataset(8)[:]
        for step in range(1, steps + 1):
            run.backward(nn.functional.cross_entropy(model(x), y))
            run.step(opt)
            run.save()
            weights[step] = {k: v.clone() for k, v in net.state_dict().items()}
    return weights


def test_rotation_leftovers_and_a_damaged_object(
    s3: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3.url("rot")
    weights = _save_steps(url, tmp_path / "a", 4, keep_last=2)
    assert s3.folders("rot") == ["step-00000003", "step-00000004"]
    s3.put("rot/step-00000009/model.safetensors", b"an upload that never finished")
    s3.flip_byte("rot/step-00000004/model.safetensors", -3)  # one bit of a weight
    with pt.Run(strategy="cpu", progress=False, ckpt_dir=url, run_dir=tmp_path / "b") as run:
        info = run.latest_checkpoint()
        assert info is not None and info.step == 3
        net = mlp()
        run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        run.resume()
        assert run.global_step == 3
        assert all(torch.equal(weights[3][k], v) for k, v in net.state_dict().items())
        run.save()  # removes the leftover; a second save at step 3 gets a folder of its own
    err = capsys.readouterr().err
    assert f"skipping {url}/step-00000004" in err and "checksum" in err
    assert "step-00000009" not in err  # no manifest: never a checkpoint, not even a skipped one
    assert "step-00000009" not in s3.folders("rot")
    assert "step-00000003.1" in s3.folders("rot")


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(["ckpt", *args])
    except SystemExit as exit_info:
        code = int(exit_info.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ckpt_commands_and_load_weights_read_urls(
    s3: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3.url("cli")
    with pt.Run(strategy="cpu", progress=False, ckpt_dir=url, run_dir=tmp_path) as run:
        net = mlp()
        run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        folder = run.save(extras={"best": 0.5})
    assert folder is not None
    ckpt = f"{url}/{folder.name}"
    capsys.readouterr()
    code, out, _ = _cli(["inspect", ckpt, "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["path"] == ckpt and report["format"] == "paratrain"
    assert report["resume_state"]["extras"] == ["best"]
    code, out, _ = _cli(["inspect", url, "--json"], capsys)
    assert code == 0 and json.loads(out)["checkpoints"] == [
        {"path": ckpt, "valid": True, "problems": []}
    ]
    code, out, _ = _cli(["diff", ckpt, str(folder)], capsys)  # the remote and its staging copy
    assert code == 0 and "identical: yes" in out
    for path in (ckpt, f"{ckpt}/model.safetensors"):  # a checkpoint, and a single remote file
        model = mlp()
        report_ = pt.load_weights(model, path)
        assert report_.keys == 6 and all(
            torch.equal(v, net.state_dict()[k]) for k, v in model.state_dict().items()
        )
    # To object storage: written locally, then uploaded (a folder's index last); never over.
    code, out, err = _cli(["convert", ckpt, f"{url}-out/model.pt", "--to", "pt"], capsys)
    assert code == 0, err
    code, out, err = _cli(["convert", ckpt, f"{url}-out/model.pt", "--to", "pt"], capsys)
    assert code == 2 and "already exists" in " ".join(err.split())
    code, out, err = _cli(["convert", ckpt, f"{url}-hf", "--to", "hf"], capsys)
    assert code == 0, err
    assert sorted(s3.keys("cli-hf")) == [
        "cli-hf/model.safetensors", "cli-hf/model.safetensors.index.json"
    ]  # fmt: skip
    for remote in (f"{url}-out/model.pt", f"{url}-hf"):
        code, out, _ = _cli(["diff", ckpt, remote], capsys)
        assert code == 0 and "identical: yes" in out
    code, out, _ = _cli(["convert", ckpt, str(tmp_path / "model.pt"), "--to", "pt"], capsys)
    assert code == 0 and (tmp_path / "model.pt").is_file()
    s3.flip_byte(f"cli/{folder.name}/optimizer.safetensors", -1)
    code, out, _ = _cli(["verify", url], capsys)
    assert code == 1 and f"BAD: {folder.name} (optimizer.safetensors fails its checksum" in out
    assert "Traceback" not in out


def test_ckpt_reshard_reads_and_writes_urls(
    s3: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run's checkpoint folder on S3 (its newest intact checkpoint; the newest is damaged
    here) resharded to FSDP at 2 ranks into another S3 folder, uploaded manifest last; a run
    resumes from that URL, and it reshards back to one process bit for bit."""
    url = s3.url("src")
    weights = _save_steps(url, tmp_path / "a", 2, keep_last=None)
    s3.flip_byte("src/step-00000002/model.safetensors", -3)
    args = ["reshard", url, s3.url("fsdp"), "--to-layout", "fsdp", "--world", "2"]
    code, out, err = _cli(args, capsys)
    assert code == 0, err
    assert f"wrote {s3.url('fsdp')}/step-00000001 (fsdp at 2 rank(s), step 1" in out, out
    keys = s3.keys("fsdp/step-00000001")
    assert {f"fsdp/step-00000001/dcp/__{r}_0.distcp" for r in (0, 1)} <= set(keys)
    assert "fsdp/step-00000001/manifest.json" in keys
    with pt.Run(strategy="cpu", progress=False, ckpt_dir=s3.url("fsdp"), run_dir=tmp_path / "b"
                ) as run:  # fmt: skip
        net = mlp()
        run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        run.resume()
        assert run.global_step == 1
    assert all(torch.equal(weights[1][k], v) for k, v in net.state_dict().items())
    code, out, err = _cli(args, capsys)  # never over an existing checkpoint
    assert code == 2 and "already exists" in " ".join(err.split()), err
    code, out, err = _cli(["reshard", f"{s3.url('fsdp')}/step-00000001", str(tmp_path / "back"),
                           "--to-layout", "single"], capsys)  # fmt: skip
    assert code == 0, err
    model = mlp()
    assert pt.load_weights(model, str(tmp_path / "back" / "step-00000001")).keys == 6
    assert all(torch.equal(weights[1][k], v) for k, v in model.state_dict().items())
    code, out, err = _cli(["reshard", s3.url("nothing-here"), str(tmp_path / "x"),
                           "--to-layout", "single"], capsys)  # fmt: skip
    assert code == 2 and "does not exist" in err and "Traceback" not in err, err


def test_async_save_uploads_in_the_background(
    s3: Bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = s3.url("async")
    weights = _save_steps(url, tmp_path / "a", 3, async_save=True, keep_last=None)
    assert s3.folders("async") == [f"step-{s:08d}" for s in (1, 2, 3)]
    for run_dir, fetched in ((tmp_path / "b", True), (tmp_path / "a", False)):  # a, cached
        capsys.readouterr()
        with pt.Run(strategy="cpu", progress=False, ckpt_dir=url, run_dir=run_dir) as run:
            net = mlp()
            run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
            run.resume()
            assert run.global_step == 3
        assert all(torch.equal(weights[3][k], v) for k, v in net.state_dict().items())
        assert ("paratrain: fetched" in capsys.readouterr().out) == fetched


def _refusal(**settings: Any) -> str:
    with pytest.raises(ConfigError) as info:
        pt.Run(strategy="cpu", progress=False, **settings)
    return str(info.value)


def test_unusable_urls_are_one_paragraph_errors(
    s3: Bucket,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "names no bucket" in _refusal(ckpt_dir="s3://")
    assert "protocol 'nope'" in _refusal(ckpt_dir="nope://bucket/run")
    assert "went through pathlib.Path" in _refusal(ckpt_dir=Path("s3://b/run"))
    assert "one slash after the protocol" in _refusal(ckpt_dir="s3:/b/run")  # not a local dir
    assert "bucket does not exist" in _refusal(ckpt_dir="s3://no-such-bucket/run")
    options = {"key": "testing"}
    assert "not a URL" in _refusal(ckpt_dir=tmp_path, ckpt_storage_options=options)
    code, _, err = _cli(["inspect", "s3://no-such-bucket/run/step-00000001"], capsys)
    assert code == 2 and "bucket does not exist" in err and "Traceback" not in err
    code, _, err = _cli(["verify", s3.url("nothing/here")], capsys)
    assert code == 2 and "does not exist" in err
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as if s3fs were not installed
    loaded = sys.modules["fsspec.registry"]._registry  # classes fsspec imported already
    monkeypatch.delitem(loaded, "s3", raising=False)
    assert "pip install 'paratrain[s3]'" in _refusal(ckpt_dir=s3.url("run"))


def test_storage_options_credentials_and_an_unreachable_endpoint(
    s3: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = {"key": "testing", "secret": "s3cr3t-value", "client_kwargs": {"region_name": "x"}}
    with pt.Run(
        strategy="cpu",
        progress=False,
        ckpt_dir=s3.url("opts"),
        ckpt_storage_options=secret,
        run_dir=tmp_path,
    ):
        pass
    recorded = (tmp_path / "run.json").read_text()
    assert "s3cr3t-value" not in recorded and "<hidden>" in recorded
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    text = _refusal(ckpt_dir=s3.url("opts"))
    assert "No credentials were found" in text and "AWS_ACCESS_KEY_ID" in text
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    fast = {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}
    text = _refusal(ckpt_dir=s3.url("opts"), ckpt_storage_options=fast | secret)
    assert "cannot be reached" in text and "AWS_ENDPOINT_URL" in text


def test_a_bad_bucket_name_says_why_and_an_empty_one_suggests_no_bucket(s3: Bucket) -> None:
    text = _refusal(ckpt_dir="s3://Bad_Bucket!/run")
    assert "Invalid bucket name" in text and "Bad_Bucket!" in text  # botocore's reason, in full
    text = _refusal(ckpt_dir="s3:///run")
    assert "names no bucket" in text and "aws s3 mb" not in text


def test_fresh_cannot_move_another_runs_checkpoints_on_object_storage(
    s3: Bucket, tmp_path: Path
) -> None:
    """The store says it cannot rename a folder there; the run refuses before training, and
    the other run's checkpoints stay where they are."""
    url = s3.url("shared")
    _train(url, tmp_path / "a", stop_at=2)
    fresh = dict(ckpt_dir=url, run_dir=tmp_path / "b", previous_run="fresh")
    refused = r"cannot move the checkpoints at .* aside on object"
    with pytest.raises(ConfigError, match=refused), pt.Run(progress=False, **fresh) as run:
        net = mlp()
        model, _ = run.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        run.backward(model(torch.ones(2, 6)).sum())
    with pt.Run(strategy="cpu", progress=False, ckpt_dir=url, run_dir=tmp_path / "c") as run:
        assert run.latest_checkpoint() is not None and run.latest_checkpoint().step == 2
