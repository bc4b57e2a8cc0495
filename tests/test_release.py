"""The release: an sdist and a wheel that ``twine check`` accepts, and a wheel that installs into a
fresh virtual environment and runs ``paratrain --help``, ``--version`` and ``doctor --quick``.

    make release-test                      # or: pytest -m release tests/test_release.py

The build runs on a copy of the checkout (so no ``build/`` or ``*.egg-info`` is left in it) and
without isolation: setuptools comes from the test environment instead of a download, which keeps
the test at about a minute. The fresh venv gets the torch the Makefile pins (``TORCH_SPEC``, a CPU
build by default), then the wheel.
"""

from __future__ import annotations

import ast
import email
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import paratrain

ROOT = Path(__file__).resolve().parents[1]
# Building and installing take about a minute, mostly pip; allow for a slow package index.
RELEASE_TIMEOUT_S = 900


def defined_version() -> str:
    """The version as ``src/paratrain/core/version.py`` defines it, the one place it is written."""
    source = ROOT / "src" / "paratrain" / "core" / "version.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
            "__version__"
        ]:
            return str(ast.literal_eval(node.value))
    raise AssertionError("src/paratrain/core/version.py does not set __version__")


def test_every_public_name_is_listed_and_resolves() -> None:
    # A fresh interpreter: here another test may already have imported the lazy names.
    listed = subprocess.run(
        [sys.executable, "-c", "import paratrain; print(*dir(paratrain))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in paratrain.__all__:
        assert name in listed, name
        assert getattr(paratrain, name) is not None, name


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if not (ROOT / ".git").exists():
        pytest.skip("builds from a git checkout (the files git tracks); this tree is not one")
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
    done = subprocess.run(
        [*build, "--outdir", str(out)], cwd=source, capture_output=True, text=True
    )
    shutil.rmtree(source, ignore_errors=True)
    assert done.returncode == 0, done.stdout + done.stderr
    sdist = next(out.glob("*.tar.gz"))
    wheel = next(out.glob("*.whl"))
    return sdist, wheel


@pytest.mark.release
@pytest.mark.timeout(RELEASE_TIMEOUT_S)
def test_the_distributions_pass_twine_and_carry_the_license(built: tuple[Path, Path]) -> None:
    sdist, wheel = built
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    with tarfile.open(sdist) as tar:
        top = {n.partition("/")[2] for n in tar.getnames()}  # below paratrain-X.Y.Z/
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"} <= top, sorted(top)
    with zipfile.ZipFile(wheel) as whl:
        meta_name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(whl.read(meta_name))
        assert any(n.endswith("licenses/LICENSE") for n in whl.namelist())
        assert any(n.endswith("paratrain/py.typed") for n in whl.namelist())
    version = defined_version()
    assert meta["Version"] == version
    assert meta["License-Expression"] == "Apache-2.0"
    assert wheel.name.startswith(f"paratrain-{version}-py3-none-any")
    assert sdist.name == f"paratrain-{version}.tar.gz"


@pytest.fixture
def venv(tmp_path: Path) -> Iterator[Path]:
    """A fresh virtual environment, removed afterwards (with torch it is about 800 MiB)."""
    path = tmp_path / "venv"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.release
@pytest.mark.timeout(RELEASE_TIMEOUT_S)
def test_the_wheel_installs_and_runs_in_a_fresh_venv(
    built: tuple[Path, Path], venv: Path, tmp_path: Path
) -> None:
    _, wheel = built
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    # Nothing of this checkout may leak in: the venv sees only what the wheel installed.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    torch = os.environ.get("TORCH_SPEC", "torch==2.13.0")  # the Makefile's CPU build
    # --no-compile: byte-compiling all of torch would take most of the test's minute.
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-compile", torch, str(wheel)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr

    def paratrain_cli(*argv: str) -> str:
        done = subprocess.run(
            [str(venv / "bin" / "paratrain"), *argv],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done.stdout

    where = subprocess.run(
        [str(python), "-c", "import paratrain; print(paratrain.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, env=env, check=True,
    ).stdout  # fmt: skip
    assert Path(where.strip()).is_relative_to(venv), where
    assert "usage: paratrain" in paratrain_cli("--help")
    assert paratrain_cli("--version").strip() == f"paratrain {defined_version()}"
    assert "torch import" in paratrain_cli("doctor", "--quick")  # the check, not a crash
