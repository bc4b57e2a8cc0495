"""Reading scripts, folders and ignore comments."""

from __future__ import annotations

from pathlib import Path

import pytest

from paratrain.commands.check.engine import check_paths, scripts
from paratrain.commands.check.walk import Walk
from paratrain.commands.cli import main
from paratrain.errors import ConfigError

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\n"


def test_ignore_comments_silence_one_rule_or_all(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "a = torch.cuda.amp.GradScaler()  # paratrain: ignore[PT012]\n"
        "b = torch.cuda.amp.GradScaler()  # paratrain: ignore[PT001, PT006]\n"
        "c = torch.load('m.pt')  # paratrain: ignore\n"
    )
    assert [(f.rule, f.line) for f in check_paths([script]).findings] == [("PT012", 3)]


def test_folders_give_their_scripts_sorted_and_findings_are_sorted(tmp_path: Path) -> None:
    (tmp_path / "b.py").write_text(BAD)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.py").write_text("x = torch.load('m')\n" + BAD)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "c.py").write_text(BAD)
    report = check_paths([tmp_path])
    where = [(Path(f.path).name, f.line, f.rule) for f in report.findings]
    assert where == [("b.py", 2, "PT012"), ("a.py", 1, "PT008"), ("a.py", 3, "PT012")]
    assert report.files == 2


def test_select_limits_the_rules(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = torch.load('m')\n" + BAD)
    assert {f.rule for f in check_paths([tmp_path], select={"PT012"}).findings} == {"PT012"}


def test_broken_scripts_are_error_lines_and_the_rest_is_checked(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def f(:\n")
    (tmp_path / "b.py").write_bytes(b"x = '\xff\xfe'\n")
    (tmp_path / "c.py").write_text(BAD)
    report = check_paths([tmp_path])
    assert [f.rule for f in report.findings] == ["PT012"]
    assert len(report.errors) == 2
    assert (
        report.errors[0].startswith(f"{tmp_path / 'a.py'}:1:")
        and "cannot parse" in (report.errors[0])
    )
    assert "not UTF-8" in report.errors[1]


def test_a_missing_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.py: no such file or folder"):
        check_paths([tmp_path / "missing.py"])


def test_a_folder_without_scripts_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no \.py files"):
        check_paths([tmp_path])


def _tree(root: Path, files: list[str], gitignore: str = "") -> None:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x = 1\n")
    if gitignore:
        (root / ".gitignore").write_text(gitignore)


def _checked(root: Path, report_paths: list[Path]) -> list[str]:
    return [p.relative_to(root).as_posix() for p in report_paths]


def test_a_folder_leaves_out_environments_builds_and_what_gitignore_ignores(
    tmp_path: Path,
) -> None:
    _tree(
        tmp_path,
        [
            "train.py", "pkg/model.py", "myenv/lib/site.py", "build/lib/copy.py",
            "pkg/node_modules/x.py", "logs/run.py", "data/logs/keep.py", "out/a.py",
            "nested/out/b.py", "notes.py", "pkg/dist/c.py", ".hidden/d.py",
        ],
        gitignore="# comment\n/out\nlogs/\n!nested\nnotes.py\n",
    )  # fmt: skip
    (tmp_path / "myenv" / "pyvenv.cfg").write_text("home = /usr\n")
    found = scripts([tmp_path])
    assert _checked(tmp_path, found.scripts) == ["nested/out/b.py", "pkg/model.py", "train.py"]
    assert sorted(s.split("/")[-1] for s in found.skipped) == [
        "build (excluded)", "dist (excluded)", "logs (.gitignore)", "logs (.gitignore)",
        "myenv (a virtual environment)", "node_modules (excluded)", "out (.gitignore)",
    ]  # fmt: skip
    named = scripts([tmp_path / "build" / "lib" / "copy.py"])  # a file named is checked
    assert named.scripts == [tmp_path / "build" / "lib" / "copy.py"]


def test_exclude_replaces_the_defaults_and_extend_exclude_adds(tmp_path: Path) -> None:
    _tree(tmp_path, ["train.py", "build/a.py", "legacy/old/b.py", "legacy/c.py"])
    replaced = scripts([tmp_path], Walk(exclude=["legacy"]))
    assert _checked(tmp_path, replaced.scripts) == ["build/a.py", "train.py"]
    extended = scripts([tmp_path], Walk(extend_exclude=["legacy/old"]))
    assert _checked(tmp_path, extended.scripts) == ["legacy/c.py", "train.py"]


def test_the_report_says_what_was_not_entered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _tree(tmp_path, ["train.py", "venv/x.py"])
    assert main(["check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"Not entered: {tmp_path.as_posix()}/venv (excluded)" in out
    _tree(tmp_path / "only", ["build/a.py"])
    with pytest.raises(ConfigError, match=r"no \.py files in .* \(not entered: .*build"):
        scripts([tmp_path / "only"])


def test_gitignore_negations_anchors_and_packages_named_like_builds(tmp_path: Path) -> None:
    """Shapes met in public repositories: mmengine's ``dist/`` package of distributed helpers,
    litgpt's ``data`` ignored everywhere but brought back for its package, detectron2's
    ``/projects/*/datasets`` (one level, not any depth)."""
    _tree(
        tmp_path,
        [
            "lib/dist/__init__.py", "lib/dist/utils.py", "dist/wheel_helper.py",
            "data/raw.py", "lib/data/__init__.py", "lib/data/loaders.py",
            "projects/a/datasets/x.py", "projects/a/pkg/sets/datasets/y.py",
        ],
        gitignore="data\n!lib/data\n/projects/*/datasets\n",
    )  # fmt: skip
    found = scripts([tmp_path])
    assert _checked(tmp_path, found.scripts) == [
        "lib/data/__init__.py", "lib/data/loaders.py", "lib/dist/__init__.py",
        "lib/dist/utils.py", "projects/a/pkg/sets/datasets/y.py",
    ]  # fmt: skip
    assert sorted(s.removeprefix(f"{tmp_path.as_posix()}/") for s in found.skipped) == [
        "data (.gitignore)", "dist (excluded)", "projects/a/datasets (.gitignore)",
    ]  # fmt: skip
