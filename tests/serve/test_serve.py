"""``paratrain serve`` against real servers: JupyterLab and OpenSSH's sshd, on loopback ports.

The entrypoint runs as an unprivileged user, as in the image. When the tests run as root (CI),
they run it inside a user namespace as the account ``make serve-deps`` creates, so sshd and
Jupyter see a non-root user while the files of this checkout stay readable.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from paratrain.distributed.ports import free_port

SERVE_USER = "paratrain-ci"
SSH_OPTIONS = [
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
]  # fmt: skip


def _as_user() -> tuple[list[str], str]:
    """The command prefix that runs as an unprivileged user, and that user's name."""
    if os.geteuid() != 0:
        return [], pwd.getpwuid(os.geteuid()).pw_name
    try:
        entry = pwd.getpwnam(SERVE_USER)
    except KeyError:
        pytest.fail(f"no account {SERVE_USER!r} to log in as: run `make serve-deps` (as root)")
    prefix = ["unshare", "--user", f"--map-user={entry.pw_uid}", f"--map-group={entry.pw_gid}"]
    return prefix, SERVE_USER


def _env(home: Path, **extra: str) -> dict[str, str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_TOKEN", "SSH_AUTHORIZED_KEYS")}
    return {**env, "HOME": str(home), "PATH": path, **extra}


@dataclass
class Served:
    proc: subprocess.Popen[str]
    user: str
    jupyter_port: int
    ssh_port: int
    key: Path
    output: Path

    def text(self) -> str:
        return self.output.read_text()

    def ssh(self, *command: str, user: str | None = None, key: Path | None = None) -> str:
        result = subprocess.run(
            ["ssh", *SSH_OPTIONS, "-p", str(self.ssh_port), "-i", str(key or self.key),
             f"{user or self.user}@127.0.0.1", *command],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return result.stdout


def _keypair(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def _status(port: int, token: str | None = None) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/status")
    if token is not None:
        request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def _wait_for(check: object, what: str, proc: subprocess.Popen[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"paratrain serve exited ({proc.returncode}) before {what}"
        try:
            if check():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.3)
    pytest.fail(f"{what} did not happen within {timeout} s")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    if shutil.which("sshd") is None and not os.access("/usr/sbin/sshd", os.X_OK):
        pytest.fail(
            "sshd is not installed: run `make serve-deps` (as root) or install openssh-server"
        )
    prefix, user = _as_user()
    home = tmp_path / "home"
    home.mkdir()
    key = _keypair(tmp_path / "id_ed25519")
    jupyter_port, ssh_port = free_port(), free_port()
    output = tmp_path / "serve.log"
    with output.open("w") as log:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "paratrain", "serve", "--bind", "127.0.0.1",
             "--jupyter-port", str(jupyter_port), "--ssh-port", str(ssh_port),
             "--root-dir", str(tmp_path)],
            # JUPYTER_TOKEN empty, as compose.yaml passes it when unset: a token is generated
            env=_env(home, SSH_AUTHORIZED_KEYS=key.with_suffix(".pub").read_text(),
                     JUPYTER_TOKEN=""),
            stdout=log, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    served = Served(proc, user, jupyter_port, ssh_port, key, output)
    try:
        _wait_for(lambda: _status(jupyter_port) == 403, "Jupyter answering", proc)
        _wait_for(lambda: "Server listening" in served.text(), "sshd listening", proc)
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_jupyter_needs_its_token_and_ssh_takes_the_key_only(served: Served) -> None:
    text = served.text()
    line = next(ln for ln in text.splitlines() if ln.startswith("paratrain serve: Jupyter: "))
    token = line.split("token=", 1)[1].split()[0]
    assert len(token) >= 40 and text.count(token) == 1  # generated, printed once
    assert _status(served.jupyter_port) == 403
    assert _status(served.jupyter_port, "x" * 43) == 403
    assert _status(served.jupyter_port, token) == 200

    report = json.loads(served.ssh("paratrain", "doctor", "--json", "--quick"))
    assert report["facts"]["python"] == json.loads(
        subprocess.run([sys.executable, "-m", "paratrain", "doctor", "--json", "--quick"],
                       capture_output=True, text=True, check=True).stdout
    )["facts"]["python"]  # fmt: skip

    other = _keypair(served.key.with_name("other"))
    refused = {
        "root": ["-i", str(served.key), "root@127.0.0.1"],
        "unknown key": ["-i", str(other), f"{served.user}@127.0.0.1"],
        "password": ["-o", "PubkeyAuthentication=no", "-o", "BatchMode=no", "-o",
                     "PreferredAuthentications=password,keyboard-interactive",
                     "-o", "NumberOfPasswordPrompts=1", f"{served.user}@127.0.0.1"],
    }  # fmt: skip
    for what, args in refused.items():
        result = subprocess.run(
            ["ssh", *SSH_OPTIONS, "-p", str(served.ssh_port), *args, "true"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert result.returncode == 255, what
        # sshd offers nothing but public keys
        assert "Permission denied (publickey)" in result.stderr, (what, result.stderr)

    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(timeout=30) == 0
    assert "SIGTERM: stopping jupyter, sshd" in served.text()
    for port in (served.jupyter_port, served.ssh_port):
        with pytest.raises(OSError):
            _status(port)
    pid_file = next(Path(served.output.parent / "home").rglob("sshd.pid"), None)
    if pid_file is not None and pid_file.read_text().strip():
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)


def _serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    prefix, _ = _as_user()
    (tmp_path / "home").mkdir(exist_ok=True)
    return subprocess.run(
        [*prefix, sys.executable, "-m", "paratrain", "serve", "--bind", "127.0.0.1",
         "--jupyter-port", str(free_port()), "--ssh-port", str(free_port()), *args],
        env=_env(tmp_path / "home", **env), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ((), {"JUPYTER_TOKEN": "short"}, "at least 16"),
        (("--no-jupyter",), {"SSH_AUTHORIZED_KEYS": "hello world"}, "not an SSH public key"),
        (("--no-jupyter", "--no-ssh"), {}, "nothing to serve"),
        (("--authorized-keys", "/nonexistent/keys"), {}, "no such file"),
        (("--jupyter-port", "70000"), {}, "not a TCP port"),
    ],
)
def test_bad_settings_are_refused_before_anything_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    env: dict[str, str],
    message: str,
) -> None:
    from paratrain.commands.cli import build_parser
    from paratrain.errors import ConfigError

    for name in ("JUPYTER_TOKEN", "SSH_AUTHORIZED_KEYS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"HOME": str(tmp_path), **env}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # as the image's user
    parsed = build_parser().parse_args(["serve", "--bind", "127.0.0.1", *args])
    with pytest.raises(ConfigError, match=message):
        parsed.handler(parsed)
    assert list(tmp_path.iterdir()) == []  # nothing was made


def test_a_command_replaces_serve_and_keeps_its_exit_code(tmp_path: Path) -> None:
    result = _serve(tmp_path, "sh", "-c", "echo ran as $(id -u); exit 3")
    assert result.returncode == 3 and "ran as" in result.stdout
    missing = _serve(tmp_path, "no-such-command-here")
    assert missing.returncode == 2 and "cannot run 'no-such-command-here'" in missing.stderr


def test_root_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from paratrain.commands.cli import build_parser
    from paratrain.errors import ConfigError

    args = build_parser().parse_args(["serve", "--no-ssh"])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(ConfigError, match="does not serve Jupyter and SSH as root"):
        args.handler(args)
