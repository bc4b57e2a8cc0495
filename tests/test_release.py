"""The release: an sdist and a wheel that ``twine check`` accepts, a wheel that installs into a
fresh virtual environment and runs ``paratrain --help``, ``--version`` and ``doctor --quick``, and
the README's install lines, each run as written in a fresh virtual environment in a clone.

    make release-test                      # or: pytest -m release tests/test_release.py

The build runs on a copy of the checkout (so no ``build/`` or ``*.egg-info`` is left in it) and
without isolation: setuptools comes from the test environment instead of a download, which keeps
the test at about a minute. Each fresh venv gets the torch the Makefile pins (``TORCH_SPEC``, the
CPU build without a GPU), installed as the Makefile does (tools/install_torch.py), then paratrain.
"""

from __future__ import annotations

import ast
import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import paratrain
from tests.support.repo_tools import load_tool

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


def copy_of_checkout(where: Path) -> Path:
    """The files git tracks (and untracked ones it does not ignore), as a fresh clone has them."""
    if not (ROOT / ".git").exists():
        pytest.skip("builds from a git checkout (the files git tracks); this tree is not one")
    source = where / "paratrain"
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((ROOT / name).read_bytes())
    return source


def install_torch(python: Path, env: dict[str, str]) -> None:
    """torch as the Makefile installs it: the first of tools/install_torch.py's commands to work."""
    tool = load_tool("install_torch")
    torch = os.environ.get("TORCH_SPEC", "torch==2.13.0")  # the Makefile's pin
    errors = []
    for command in tool.commands(str(python), torch, gpu=tool.has_nvidia_gpu()):
        # --no-compile: byte-compiling all of torch would take most of the test's minute.
        done = subprocess.run([*command, "--no-compile"], capture_output=True, text=True, env=env)
        if done.returncode == 0:
            return
        errors.append(done.stdout + done.stderr)
    raise AssertionError("\n".join(errors))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    # A copy of the tracked files: the build leaves no build/ or *.egg-info in the checkout.
    source = copy_of_checkout(tmp_path_factory.mktemp("source"))
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


def readme_install_lines() -> list[str]:
    """The command lines of the README's install block (comments cut off)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Install") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block is not None, "README.md: no ```bash block under ## Install"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_install_block_is_the_clone_path() -> None:
    lines = readme_install_lines()
    assert lines[0] == "pip install ."
    assert all(line.startswith(("pip install ", "make dist && pip install ")) for line in lines)
    # `make dist` is the Makefile's build of the same sdist and wheel the fixture builds.
    done = subprocess.run(
        ["make", "-n", "dist"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "-m build --outdir dist ." in done.stdout, done.stdout


@pytest.fixture
def venv(tmp_path: Path) -> Iterator[Path]:
    """A fresh virtual environment (with torch about 1 GiB), removed afterwards in the background:
    deleting it takes half a minute of a busy disk that the next tests need not wait for."""
    path = tmp_path / "venv"
    yield path
    subprocess.Popen(["rm", "-rf", str(path)], start_new_session=True)


@pytest.mark.release
@pytest.mark.timeout(RELEASE_TIMEOUT_S)
def test_the_readme_install_lines_run_in_a_fresh_venv_in_a_clone(
    built: tuple[Path, Path], venv: Path, tmp_path: Path
) -> None:
    """Each line of the README's install block, as written, in a clone; the last installs the
    wheel over the clone's install, so the checks at the end run what the wheel holds."""
    clone = copy_of_checkout(tmp_path)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= {"PATH": f"{venv / 'bin'}:{env['PATH']}", "PIP_NO_COMPILE": "1", "PIP_QUIET": "1"}
    install_torch(venv / "bin" / "python", env)  # the README: "install torch first"
    for line in readme_install_lines():
        if line.startswith("make dist && "):
            # What `make dist` makes (checked above): the wheel the fixture built.
            (clone / "dist").mkdir(exist_ok=True)
            shutil.copy(built[1], clone / "dist")
            line = line.removeprefix("make dist && ")
        done = subprocess.run(
            ["bash", "-c", line], cwd=clone, capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        version = subprocess.run(
            ["paratrain", "--version"], cwd=tmp_path, capture_output=True, text=True, env=env
        )
        assert version.stdout.strip() == f"paratrain {defined_version()}", (line, version)
    assert line.endswith("dist/paratrain-*.whl"), "the wheel is the README's last install line"
    # The extras' packages import, and paratrain comes from the venv (the wheel), not the clone.
    imports = "import sklearn, matplotlib, tensorboard, fsspec, s3fs, mlflow, pynvml, paratrain"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", f"{imports}; print(paratrain.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(venv), done.stdout

    def paratrain_cli(*argv: str) -> str:
        done = subprocess.run(
            [str(venv / "bin" / "paratrain"), *argv],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
        return done.stdout

    assert "usage: paratrain" in paratrain_cli("--help")
    assert "torch import" in paratrain_cli("doctor", "--quick")  # the check, not a crash
