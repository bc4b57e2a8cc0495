"""The release: an sdist and a wheel that ``twine check`` accepts, and a wheel that installs into a
fresh virtual environment and runs ``paratrain --help`` and ``paratrain doctor --quick``.

The build runs without isolation (setuptools comes from the test environment, so no download);
the fresh venv gets the same CPU build of torch the Makefile pins, then the wheel.
"""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import paratrain

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_is_listed_and_resolves() -> None:
    listed = dir(paratrain)
    for name in paratrain.__all__:
        assert name in listed, name
        assert getattr(paratrain, name) is not None


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source") / "paratrain"
    # A copy of the tracked files: the build leaves no build/ or *.egg-info in the checkout.
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    build = [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel"]
    subprocess.run([*build, "--outdir", str(out)], cwd=source, check=True, capture_output=True)
    sdist = next(out.glob("*.tar.gz"))
    wheel = next(out.glob("*.whl"))
    return sdist, wheel


@pytest.mark.release
def test_the_distributions_pass_twine_and_carry_the_license(built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(sdist) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"} <= names
    with zipfile.ZipFile(wheel) as whl:
        meta_name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(whl.read(meta_name))
        assert any(n.endswith("licenses/LICENSE") for n in whl.namelist())
        assert any(n.endswith("paratrain/py.typed") for n in whl.namelist())
    assert meta["Version"] == paratrain.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert wheel.name.startswith(f"paratrain-{paratrain.__version__}-py3-none-any")


@pytest.mark.release
def test_the_wheel_installs_and_runs_in_a_fresh_venv(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    _, wheel = built
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    torch = os.environ.get("TORCH_SPEC", "torch==2.13.0")  # the Makefile's CPU build
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", torch, str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    command = venv / "bin" / "paratrain"
    for argv, expected in (
        (["--help"], "usage: paratrain"),
        (["--version"], f"paratrain {paratrain.__version__}"),
        (["doctor", "--quick"], "torch"),
    ):
        done = subprocess.run(
            [str(command), *argv], capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        assert expected in done.stdout, (argv, done.stdout)
