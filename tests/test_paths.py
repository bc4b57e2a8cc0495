"""Paths from users are checked before work starts; the checks leave nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import paratrain as pt
from paratrain.commands.cli import main
from paratrain.core.paths import check_creatable, check_new, check_output_file, existing
from paratrain.errors import CheckpointError, ConfigError


@pytest.mark.parametrize(
    "name,needle",
    [
        ("/proc/x/run", "making anything in /proc fails"),
        ("file", "is a file, not a folder"),
        ("file/sub", "is inside"),
        ("a" * 300, "File name too long"),
        ("new/" + "b" * 300, "at most 255"),
    ],
)
def test_unusable_folders_are_named(tmp_path: Path, name: str, needle: str) -> None:
    (tmp_path / "file").write_text("")
    target = name if name.startswith("/") else tmp_path / name
    before = sorted(tmp_path.iterdir())
    with pytest.raises(ConfigError, match=needle):
        check_creatable(target, "run_dir")
    assert sorted(tmp_path.iterdir()) == before


def test_a_usable_folder_passes_and_nothing_is_left(tmp_path: Path) -> None:
    check_creatable(tmp_path / "deep" / "new", "run_dir")
    check_creatable(tmp_path, "run_dir")
    assert list(tmp_path.iterdir()) == []


def test_existing_and_new_paths(tmp_path: Path) -> None:
    (tmp_path / "w.pt").write_text("")
    assert existing(tmp_path / "w.pt", "path") == tmp_path / "w.pt"
    with pytest.raises(CheckpointError, match="does not exist"):
        existing(tmp_path / "missing", "path", CheckpointError)
    with pytest.raises(ConfigError, match="File name too long"):
        existing("x" * 300, "path")
    with pytest.raises(ConfigError, match="must be a path"):
        existing(None, "path")
    with pytest.raises(ConfigError, match="already exists"):
        check_new(tmp_path / "w.pt", "out")
    with pytest.raises(ConfigError, match="othing was written"):
        check_new("/proc/x/out.pt", "out")
    assert check_new(tmp_path / "a" / "b.pt", "out") == tmp_path / "a" / "b.pt"
    with pytest.raises(ConfigError, match="is a folder"):
        check_output_file(tmp_path, "save_weights(path=...)")


def test_run_refuses_an_unusable_run_dir_from_the_script_or_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="run_dir '/proc/x'"):
        pt.Run(strategy="cpu", run_dir="/proc/x")
    with pytest.raises(ConfigError, match="ckpt_dir"):
        pt.Run(strategy="cpu", ckpt_dir=tmp_path / ("c" * 300))
    monkeypatch.setenv("PARATRAIN_RUN_DIR", "/proc/x")
    with pytest.raises(ConfigError, match="run_dir '/proc/x'"):
        pt.Run(strategy="cpu")


def test_ckpt_convert_into_proc_is_an_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch.save({"w": torch.ones(2)}, tmp_path / "w.pt")
    for out in ("/proc/x/out.pt", str(tmp_path / "w.pt" / "out.pt"), str(tmp_path / ("o" * 300))):
        with pytest.raises(SystemExit) as stop:
            main(["ckpt", "convert", str(tmp_path / "w.pt"), out, "--to", "pt"])
        err = capsys.readouterr().err.replace("\n", " ")
        assert stop.value.code == 2 and "Traceback" not in err and "othing was written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.pt"]
