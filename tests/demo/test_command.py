"""``paratrain demo``'s command line: no torch before the command runs, every flag explained."""

from __future__ import annotations

import argparse
import subprocess
import sys

from paratrain.commands.cli import build_parser


def test_importing_the_command_does_not_import_torch() -> None:
    code = "import sys, paratrain.commands.demo.command; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from paratrain.commands.cli import main\n"
        "try:\n"
        "    main(['demo', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch' in sys.modules, file=sys.stderr)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "--skip-resume" in out.stdout
    assert out.stderr.strip() == "False"


def _demo_parser() -> argparse.ArgumentParser:
    parser = build_parser("demo")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    demo: argparse.ArgumentParser = sub.choices["demo"]
    return demo


def test_every_flag_has_plain_help() -> None:
    demo = _demo_parser()
    flags = [a for a in demo._actions if a.option_strings and a.dest != "help"]
    assert {a.option_strings[0] for a in flags} >= {"--epochs", "--skip-resume", "--strategy"}
    for action in flags:
        assert action.help and len(action.help) > 10, action.option_strings
        assert "``" not in action.help and ":class:" not in action.help, action.help
    assert demo.description and "``" not in demo.description


def test_the_default_epochs_is_the_one_that_reaches_the_target() -> None:
    from paratrain.commands.demo.command import DEFAULT_EPOCHS, TARGET_ACCURACY

    args = _demo_parser().parse_args([])
    assert args.epochs == DEFAULT_EPOCHS and not args.skip_resume
    assert f"default {DEFAULT_EPOCHS}" in _help_of("--epochs")
    assert str(TARGET_ACCURACY) in _help_of("--epochs")


def _help_of(flag: str) -> str:
    action = next(a for a in _demo_parser()._actions if flag in a.option_strings)
    return str(action.help)


def test_the_demo_without_its_extra_stops_at_once_with_the_install_line() -> None:
    """Without the [demo] extra the demo refuses before any rank starts: one paragraph naming
    what is missing and the install line, exit 2, in about the time of the interpreter's start
    (torch is not imported). The missing packages are hidden from a fresh interpreter."""
    code = (
        "import importlib.util, sys, time\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name in "
        "('sklearn', 'tensorboard') else real(name, *a)\n"
        "from paratrain.commands.cli import main\n"
        "start = time.perf_counter()\n"
        "try:\n"
        "    code = main(['demo'])\n"
        "except SystemExit as stop:\n"
        "    code = stop.code\n"
        "print(code, round(time.perf_counter() - start, 3), 'torch' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    status, took, torch_imported = done.stdout.split()  # and nothing printed before
    assert status == "2" and torch_imported == "False" and float(took) < 1.0, done.stdout
    assert "needs scikit-learn, tensorboard (the [demo] extra)" in done.stderr
    assert 'pip install "paratrain[demo]"' in done.stderr and "Traceback" not in done.stderr
