"""``paratrain check`` end to end, in-process: output forms, flags and exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from paratrain.commands.cli import main

REPO = Path(__file__).resolve().parents[2]
BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()\nx = torch.load('m.pt')\n"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(BAD)
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(["check", *argv])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_text_output_names_place_rule_fix_and_api(
    script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run([str(script)], capsys)
    lines = out.splitlines()
    assert code == 1
    assert lines[0].startswith(
        f"{script.as_posix()}:2:10: PT012 [*] GradScaler from torch.cuda.amp"
    )
    assert lines[1] == '    fix: use torch.amp.GradScaler("cuda")'
    assert lines[2].startswith("    paratrain: pt.Run(precision=")
    assert lines[-2] == "Found 2 problems in 1 of 1 script checked."
    assert lines[-1] == "[*] 2 fixable with --fix (see them first with --diff)."


def test_clean_script_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ok.py").write_text("import torch\nx = torch.ones(2)\n")
    assert _run([str(tmp_path)], capsys)[:2] == (0, "No problems found in 1 script checked.\n")


def test_json_is_a_list_of_findings(script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--json", str(script)], capsys)
    found = json.loads(out)
    assert code == 1
    assert [(f["rule"], f["line"], f["col"]) for f in found] == [("PT012", 2, 10), ("PT008", 3, 5)]
    assert set(found[0]) == {"rule", "path", "line", "col", "message", "fix", "api"}


def test_sarif_has_the_driver_rules_and_located_results(
    script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["--sarif", "--select", "pt012,PT008", str(script)], capsys)
    log = json.loads(out)
    run = log["runs"][0]
    assert code == 1 and log["version"] == "2.1.0"
    assert run["tool"]["driver"]["name"] == "paratrain"
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == ["PT008", "PT012"]
    assert all(r["shortDescription"]["text"] for r in run["tool"]["driver"]["rules"])
    first = run["results"][0]
    location = first["locations"][0]["physicalLocation"]
    assert first["ruleId"] == "PT012" and first["message"]["text"]
    assert location["artifactLocation"]["uri"] == script.as_posix()
    assert location["region"] == {"startLine": 2, "startColumn": 10}


def test_select_and_ignore(script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["--json", "--select", "PT012", str(script)], capsys)
    assert [f["rule"] for f in json.loads(out)] == ["PT012"]
    code, out, _ = _run(["--json", "--ignore", "PT012,PT008", str(script)], capsys)
    assert (code, json.loads(out)) == (0, [])


@pytest.mark.parametrize("flag", ["--select", "--ignore"])
def test_unknown_rule_ids_list_the_valid_ones(
    script: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run([flag, "PT001,PT999", str(script)], capsys)
    assert code == 2
    assert "PT999: not a rule id" in err and "PT001, PT002" in err and "Traceback" not in err


def test_missing_path_and_broken_script_end_without_traceback(
    tmp_path: Path, script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run([str(tmp_path / "nope.py")], capsys)
    err = " ".join(err.split())  # the message is wrapped where the (temporary) path ends
    assert code == 2 and "no such file or folder" in err and "Traceback" not in err
    code, _, err = _run([" "], capsys)
    assert code == 2 and "empty path" in err
    broken = tmp_path / "broken.py"
    broken.write_text("for x in :\n")
    code, out, err = _run([str(broken), str(script)], capsys)
    assert code == 2 and "Traceback" not in err
    assert f"paratrain: error: {broken}:1:" in err and "cannot parse" in err
    assert "PT012" in out  # the other script is still checked
    assert out.splitlines()[-2] == (
        "Found 2 problems in 1 of 2 scripts checked (1 could not be parsed)."
    )


def test_json_reports_an_unparsable_script_as_an_entry_without_a_rule(
    tmp_path: Path, script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\nfor x in :\n")
    code, out, err = _run(["--json", str(broken), str(script)], capsys)
    entries = json.loads(out)
    assert code == 2 and "cannot parse" in err
    assert [e["rule"] for e in entries] == ["PT012", "PT008", None]
    assert entries[-1]["path"] == broken.as_posix() and entries[-1]["line"] == 2
    assert entries[-1]["message"].startswith("cannot parse:")
    code, out, _ = _run(["--sarif", str(broken), str(script)], capsys)
    (run,) = json.loads(out)["runs"]
    (note,) = run["invocations"][0]["toolExecutionNotifications"]
    assert code == 2 and note["message"]["text"].startswith("cannot parse:")
    assert len(run["results"]) == 2


def test_a_script_named_twice_is_checked_once(
    script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run([str(script), str(script.parent)], capsys)
    assert code == 1 and out.count("PT012") == 1
    assert out.splitlines()[-2] == "Found 2 problems in 1 of 1 script checked."


def test_a_folder_is_one_project_whose_modules_see_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``utils.is_main_process()`` guards when utils.py says what it returns; a helper of a
    sibling module that starts the process group makes the script distributed."""
    (tmp_path / "utils.py").write_text(
        "import torch.distributed as dist\n"
        "def init_distributed(rank):\n    dist.init_process_group('nccl', rank=rank)\n"
        "def is_main_process():\n    return dist.get_rank() == 0\n"
    )
    (tmp_path / "main.py").write_text(
        "import torch\nimport utils\nutils.init_distributed(0)\n"
        "def train(model, loss):\n    loss.backward()\n"
        "    if utils.is_main_process():\n        torch.save(model.state_dict(), 'm.pt')\n"
        "    torch.save(model.state_dict(), 'last.pt')\n"
    )
    code, out, _ = _run(["--select", "PT010", str(tmp_path)], capsys)
    assert code == 1 and [ln.split(": ")[0] for ln in out.splitlines() if "PT010" in ln] == [
        f"{(tmp_path / 'main.py').as_posix()}:8:5"
    ]


def test_examples_are_clean_but_the_seed_originals(capsys: pytest.CaptureFixture[str]) -> None:
    """The ``*_original.py`` seeds keep the tutorials' mistakes on purpose; the rest is clean."""
    code, out, _ = _run(["--json", str(REPO / "examples")], capsys)
    by_file: dict[str, set[str]] = {}
    for f in json.loads(out):
        by_file.setdefault(Path(f["path"]).name, set()).add(f["rule"])
    assert code == 1
    assert by_file == {
        "dataparallel_original.py": {"PT012", "PT014"},
        "resnet_ddp_original.py": {"PT001", "PT020"},
        "torchrun_template_original.py": {"PT001", "PT005"},
    }


SELF_REDUCED = """\
import torch
import torch.distributed as dist


def gather(values, n):
    values = torch.stack(values)
    dist.all_reduce(values)
    n = torch.tensor(n)
    dist.all_reduce(n)
    print(values, n)
"""


def test_a_value_rebuilt_from_itself_is_checked_without_a_rule_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PT024 followed ``values = torch.stack(values)`` into itself (RecursionError)."""
    script = tmp_path / "gather.py"
    script.write_text(SELF_REDUCED)
    code, out, err = _run([str(script)], capsys)
    assert code == 0 and "No problems found in 1 script checked." in out and not err


def test_a_rule_failure_is_reported_as_one_in_text_json_and_sarif(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from paratrain.commands.check import engine
    from paratrain.commands.check.findings import Rule

    def broken(tree: object, lines: object) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    rules = engine.rules_by_id()
    rules["PT024"] = Rule("PT024", "sum-reported-as-mean", "summary", broken)
    monkeypatch.setattr(engine, "rules_by_id", lambda: rules)
    script = tmp_path / "gather.py"
    script.write_text(SELF_REDUCED)
    code, out, err = _run([str(script)], capsys)
    assert code == 2 and "in 1 script checked (1 rule failure: see below)" in out
    assert "could not be parsed" not in out and "PT024 could not check this script" in err
    code, out, _ = _run([str(script), "--json"], capsys)
    [entry] = json.loads(out)
    assert entry["rule"] == "PT024" and entry["failure"] is True
    code, out, _ = _run([str(script), "--sarif"], capsys)
    [invocation] = json.loads(out)["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False
    assert "PT024 could not check" in invocation["toolExecutionNotifications"][0]["message"]["text"]
