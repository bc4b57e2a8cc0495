"""``paratrain ckpt``: inspect, verify, convert (round trips through every format), diff."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import paratrain as pt
from paratrain.commands.cli import main
from tests.support.training import mlp


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(["ckpt", *args])
    except SystemExit as exit_info:  # user errors exit with 2 from inside
        code = int(exit_info.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    torch.manual_seed(0)
    model = mlp()
    torch.save(nn.DataParallel(model).state_dict(), tmp_path / "dp.pth")
    with pt.Run(strategy="cpu", ckpt_dir=tmp_path / "ckpts", progress=False) as run:
        run.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        folder = run.save(extras={"best": 0.5})
    assert folder is not None
    return {"dp": tmp_path / "dp.pth", "ckpt": folder, "root": tmp_path / "ckpts", "tmp": tmp_path}


def test_inspect_reports_prefixes_and_resume_state(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(["inspect", str(files["dp"]), "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["wrapper_prefixes"] == {"module.": 6}
    assert report["parameters"] == sum(p.numel() for p in mlp().parameters())
    code, out, _ = _cli(["inspect", str(files["ckpt"]), "--json"], capsys)
    report = json.loads(out)
    assert report["saved_by"]["strategy"] == "cpu" and report["saved_by"]["world_size"] == 1
    assert report["resume_state"]["optimizer"] and report["resume_state"]["extras"] == ["best"]
    under = report["resumes_under"]
    assert under["world_size"] == "any" and under["layouts"].endswith("pp x dp, pp x tp")


def test_verify_exit_codes(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["verify", str(files["root"])], capsys)[0] == 0
    weights = files["ckpt"] / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x04
    weights.write_bytes(bytes(data))
    code, out, _ = _cli(["verify", str(files["ckpt"])], capsys)
    assert code == 1 and "fails its checksum" in out


@pytest.mark.parametrize(
    "chain",
    [
        ["pt"],
        ["safetensors"],
        ["dcp"],
        ["hf"],
        ["dcp", "pt"],
        ["safetensors", "dcp", "safetensors"],
        ["hf", "dcp", "hf"],
    ],
)
def test_convert_round_trips(
    files: dict[str, Path], chain: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    src = files["dp"]
    for i, fmt in enumerate(chain):
        dst = files["tmp"] / f"out{i}.{fmt}"
        assert _cli(["convert", str(src), str(dst), "--to", fmt], capsys)[0] == 0
        src = dst
    code, out, _ = _cli(["diff", str(files["dp"]), str(src), "--json"], capsys)
    assert code == 0 and json.loads(out)["identical"]
    target = mlp()
    pt.load_weights(target, src)


def test_convert_never_overwrites_and_diff_reports(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(["convert", str(files["dp"]), str(files["ckpt"]), "--to", "pt"], capsys)
    err = " ".join(err.split())  # the message is wrapped where the (temporary) path ends
    assert code == 2 and "already exists" in err and (files["ckpt"] / "manifest.json").exists()
    torch.save({"0.weight": torch.zeros(16, 6)}, files["tmp"] / "other.pt")
    code, out, _ = _cli(
        ["diff", str(files["dp"]), str(files["tmp"] / "other.pt"), "--json"], capsys
    )
    result = json.loads(out)
    assert code == 1 and not result["identical"] and "0.bias" in result["only_in_a"]
    assert "0.weight" in result["max_abs_diff"]


@pytest.mark.parametrize(
    "action", [["inspect"], ["verify"], ["convert", "--to", "pt"], ["diff"], ["diff", "--json"]]
)
@pytest.mark.parametrize("content", [b"just some text\n", b"root:x:0:0:root:/root:/bin/sh\n"])
def test_files_that_are_not_checkpoints_are_one_message(
    files: dict[str, Path], action: list[str], content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = files["tmp"] / "notes.pt"
    garbage.write_bytes(content)
    paths = {
        "inspect": [garbage],
        "verify": [garbage],
        "convert": [garbage, files["tmp"] / "out.pt"],
        "diff": [files["dp"], garbage],
    }[action[0]]
    code, out, err = _cli([action[0], *map(str, paths), *action[1:]], capsys)
    out, err = " ".join(out.split()), " ".join(err.split())  # the CLI wraps its messages
    if action[0] == "verify":  # verify reports what it found; exit 1 = not intact
        assert code == 1 and "is not a checkpoint" in out and "FAILED" in out
    else:
        assert code == 2 and "is not a checkpoint" in err and "paratrain reads" in err
    assert not (files["tmp"] / "out.pt").exists()


PARATRAIN = str(Path(sys.executable).parent / "paratrain")


def _many_keys(path: Path, n: int) -> Path:
    save_file({f"layer{i}.weight": torch.zeros(1) for i in range(n)}, str(path))
    return path


@pytest.mark.parametrize("action", ["inspect", "verify", "convert", "diff"])
def test_output_into_a_closed_pipe_ends_quietly(
    files: dict[str, Path], action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = _many_keys(files["tmp"] / "big.safetensors", 6000)  # > 64 KiB of output: outlasts a pipe
    args, expected = {
        "inspect": (["inspect", str(big)], 0),
        "verify": (["verify", str(files["root"])], 0),
        "convert": (["convert", str(files["dp"]), str(files["tmp"] / "c.pt"), "--to", "pt"], 0),
        "diff": (["diff", str(files["dp"]), str(big), "--json"], 1),
    }[action]
    read_end, write_end = os.pipe()
    os.close(read_end)  # whoever reads the output is gone before the first byte
    stdout = open(write_end, "w")  # noqa: SIM115 (closed below, as the interpreter would at exit)
    monkeypatch.setattr(sys, "stdout", stdout)
    assert main(["ckpt", *args]) == expected
    stdout.close()  # the flush at exit: raises BrokenPipeError unless stdout was redirected


def test_diff_into_head_ends_quietly(files: dict[str, Path]) -> None:
    """The reported case, end to end: a real process whose reader exits after one line."""
    big = _many_keys(files["tmp"] / "big.safetensors", 6000)
    result = subprocess.run(
        f"'{PARATRAIN}' ckpt diff '{files['dp']}' '{big}' --json | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.stdout == "{\n"
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr


def test_a_dcp_folder_of_model_and_optimizer_converts_to_the_model_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A DCP folder saved as ``{"model": ..., "optimizer": ...}`` (torchtitan's and most
    scripts' shape) gives its model's weights; one saved as a flat state dict gives them all."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    with warnings.catch_warnings():  # one process saving: intended
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": msd, "optimizer": osd}, checkpoint_id=tmp_path / "both")
        dcp.save(model.state_dict(), checkpoint_id=tmp_path / "flat")
    torch.save(model.state_dict(), tmp_path / "reference.pt")
    for folder in ("both", "flat"):
        for to in ("safetensors", "pt"):  # streamed, and read whole
            out = tmp_path / f"{folder}.{to}"
            assert _cli(["convert", str(tmp_path / folder), str(out), "--to", to], capsys)[0] == 0
            code, report, _ = _cli(["diff", str(tmp_path / "reference.pt"), str(out), "--json"],
                                   capsys)  # fmt: skip
            assert code == 0 and json.loads(report)["identical"], (folder, to, report)


def test_a_map_file_name_too_long_to_look_up_is_one_message(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = files["tmp"] / "out.pt"
    args = ["convert", str(files["dp"]), str(out), "--to", "pt", "--map", "a" * 400]
    code, _, err = _cli(args, capsys)
    assert code == 2 and "no such file" in " ".join(err.split()) and not out.exists()


_SLOW_WRITER = """
import sys, time
import paratrain.checkpoint.streamed as streamed
from paratrain.commands.cli import main

def slowly(read):
    def each(*args, **kwargs):
        print("writing", flush=True)  # the parent stops the process now, mid-write
        time.sleep(0.3)
        return read(*args, **kwargs)
    return each

streamed.Source.read = slowly(streamed.Source.read)
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "args,stop",
    [
        (["convert", "in.safetensors", "out.pt", "--to", "pt"], "SIGTERM"),
        (["convert", "in.safetensors", "out", "--to", "dcp"], "SIGTERM"),
        (["convert", "in.safetensors", "out", "--to", "hf", "--max-shard-size", "1KB"], "SIGTERM"),
        (["reshard", "ckpts", "out", "--to-layout", "fsdp", "--world", "2"], "SIGTERM"),
        (["convert", "in.safetensors", "out.pt", "--to", "pt"], "SIGINT"),
    ],
)
def test_a_conversion_stopped_mid_write_leaves_nothing(
    files: dict[str, Path], args: list[str], stop: str
) -> None:
    """kill (a scheduler's stop) or Ctrl-C while the output is being written: one line, exit
    128 + the signal, and no output or staging folder left (SIGTERM used to leave .tmp-*)."""
    import signal

    tmp = files["tmp"]
    save_file({f"t{i}": torch.full((64,), float(i)) for i in range(8)}, tmp / "in.safetensors")
    child = subprocess.Popen(
        [sys.executable, "-c", _SLOW_WRITER, "ckpt", *args],
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "writing"
    child.send_signal(getattr(signal, stop))
    _, err = child.communicate(timeout=60)
    assert child.returncode == 128 + getattr(signal, stop), err
    assert f"stopped by {stop}" in err and "nothing was left at" in err, err
    assert "Traceback" not in err, err
    left = {p.name for p in tmp.iterdir()} - {"in.safetensors", "dp.pth", "ckpts"}
    assert not left, left
    assert not [p for p in (tmp / "ckpts").iterdir() if p.name.startswith(".tmp")]


def test_one_shard_file_of_a_dcp_folder_is_named_as_such(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A .distcp file alone is not a checkpoint (its tensors are found through .metadata): the
    message says which folder to give, instead of calling a healthy file corrupt."""
    out = files["tmp"] / "out-dcp"
    assert _cli(["convert", str(files["dp"]), str(out), "--to", "dcp"], capsys)[0] == 0
    shard = out / "__0_0.distcp"
    for action in ("inspect", "verify"):
        code, text, err = _cli([action, str(shard)], capsys)
        said = " ".join((text + err).split())
        assert code in (1, 2) and "one rank's file of a DCP (sharded) checkpoint" in said, said
        assert f"Give the folder ({out})" in said and "corrupt" not in said, said
