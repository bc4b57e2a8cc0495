"""What ``paratrain serve`` starts: JupyterLab behind a token, and sshd that takes keys only.

    jupyter = jupyter_server(Settings(...))      # a Server: argv, env, and what to print
    ssh = ssh_server(Settings(...))              # None when no key was given (sshd stays off)

Both are built from :class:`Settings`, checked first: a token that is empty or too short, a
port out of range, a missing ``sshd``, a key file that is not a key are errors that name the
fix, before anything starts.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import re
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from paratrain.errors import ConfigError, EnvironmentMismatchError

MIN_TOKEN = 16
"""Shortest token accepted from ``JUPYTER_TOKEN`` (a generated one has 43 characters)."""
KEY_LINE = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+)\s+[A-Za-z0-9+/=]+(\s.*)?$")
# Passed into SSH sessions, so `ssh host paratrain doctor` finds the image's Python and GPUs.
SESSION_ENV = ("PATH", "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "CUDA_HOME", "PYTHONPATH")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Where and how to serve (flags of ``paratrain serve``, with their environment defaults)."""

    bind: str
    jupyter_port: int | None
    ssh_port: int | None
    root_dir: Path
    state_dir: Path
    authorized_keys: list[Path] = field(default_factory=list)
    keys_from_env: str = ""
    token: str | None = None


@dataclass(frozen=True)
class Server:
    """A server process to start and watch."""

    name: str
    argv: list[str]
    env: dict[str, str]
    notes: list[str]


def check_port(name: str, port: int) -> int:
    if not 1 <= port <= 65535:
        raise ConfigError(f"{name} {port} is not a TCP port (1-65535). Pass e.g. {name} 8888.")
    return port


def jupyter_server(s: Settings) -> Server:
    """JupyterLab on ``s.bind``:``s.jupyter_port``; the token never goes on a command line."""
    assert s.jupyter_port is not None
    if s.token is not None and len(s.token) < MIN_TOKEN:
        raise ConfigError(
            f"JUPYTER_TOKEN is {len(s.token)} characters long; a token protects a server that "
            f"runs code, so it must have at least {MIN_TOKEN}. Leave JUPYTER_TOKEN unset to get "
            "a generated one, or make one with `python -c 'import secrets; "
            "print(secrets.token_urlsafe())'`."
        )
    if importlib.util.find_spec("jupyterlab") is None:
        raise EnvironmentMismatchError(
            "Jupyter is not installed here. `pip install jupyterlab` (the image has it), or "
            "pass --no-jupyter."
        )
    generated = s.token is None
    token = secrets.token_urlsafe(32) if generated else str(s.token)
    where = "127.0.0.1" if s.bind in ("0.0.0.0", "::") else s.bind
    shown = token if generated else "<JUPYTER_TOKEN>"
    argv = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        f"--ServerApp.ip={s.bind}", f"--ServerApp.port={s.jupyter_port}",
        "--ServerApp.port_retries=0", f"--ServerApp.root_dir={s.root_dir}",
        "--ServerApp.password=", "--ServerApp.allow_remote_access=True",
    ]  # fmt: skip
    return Server(
        name="jupyter",
        argv=argv,
        env={"JUPYTER_TOKEN": token},  # read by jupyter_server; not visible in `ps`
        notes=[
            f"Jupyter: http://{where}:{s.jupyter_port}/lab?token={shown} "
            f"({'generated token, printed only here' if generated else 'token from JUPYTER_TOKEN'})"
        ],
    )


def ssh_server(s: Settings) -> Server | None:
    """sshd as this user on ``s.bind``:``s.ssh_port``, public keys only; None without a key."""
    assert s.ssh_port is not None
    keys = _collect_keys(s)
    if not keys:
        return None
    sshd = shutil.which("sshd") or next(
        (p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(p, os.X_OK)), None
    )
    if sshd is None:
        raise EnvironmentMismatchError(
            "SSH keys were given but sshd is not installed. Install it (`apt-get install "
            "openssh-server`; the image has it) or pass --no-ssh."
        )
    state = s.state_dir / "ssh"
    try:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        state.chmod(0o700)
    except OSError as err:
        raise ConfigError(
            f"--state-dir {s.state_dir}: cannot make {state} ({err.strerror}). Pass a folder this "
            "user can write (a volume keeps the host key across restarts)."
        ) from None
    host_key = state / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True
        )
    authorized = state / "authorized_keys"
    authorized.write_text("\n".join(keys) + "\n")
    authorized.chmod(0o600)
    config = state / "sshd_config"
    config.write_text(_sshd_config(s, state, host_key, authorized))
    config.chmod(0o600)
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", f"{host_key}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    user = getpass.getuser()
    return Server(
        name="sshd",
        argv=[sshd, "-D", "-e", "-f", str(config)],
        env={},
        notes=[
            f"SSH: ssh -p {s.ssh_port} {user}@<host> ({len(keys)} key(s); passwords and root "
            f"are refused; host key {fingerprint})"
        ],
    )


def _collect_keys(s: Settings) -> list[str]:
    """Public-key lines from the files and ``SSH_AUTHORIZED_KEYS``; anything else is an error."""
    sources = []
    for path in s.authorized_keys:
        if path.is_file():
            try:
                sources.append((str(path), path.read_text()))
            except (OSError, UnicodeDecodeError) as err:
                raise ConfigError(
                    f"{path}: cannot be read as a file of public keys ({err}). Mount the "
                    "contents of a .pub file there."
                ) from None
    sources.append(("SSH_AUTHORIZED_KEYS", s.keys_from_env))
    keys: list[str] = []
    for where, text in sources:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not KEY_LINE.match(line):
                raise ConfigError(
                    f"{where}, line {number}: not an SSH public key ({line[:40]!r}...). Give "
                    'the contents of a .pub file, e.g. SSH_AUTHORIZED_KEYS="$(cat '
                    '~/.ssh/id_ed25519.pub)"; options before the key type are not accepted.'
                )
            keys.append(line)
    return keys


def _sshd_config(s: Settings, state: Path, host_key: Path, authorized: Path) -> str:
    user = getpass.getuser()
    env = " ".join(f'"{k}={os.environ[k]}"' for k in SESSION_ENV if k in os.environ)
    lines = [
        f"Port {s.ssh_port}",
        f"ListenAddress {s.bind}",
        f"HostKey {host_key}",
        f"PidFile {state / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitEmptyPasswords no",
        "PermitRootLogin no",
        "UsePAM no",
        f"AllowUsers {user}",
        # The keys are copied into a 0700 folder of this user; the folders above it (a mounted
        # volume, /tmp in tests) are not for sshd to judge.
        "StrictModes no",
        "X11Forwarding no",
        "PrintMotd no",
        "Subsystem sftp internal-sftp",
    ]
    if env:
        lines.append(f"SetEnv {env}")
    return "\n".join(lines) + "\n"
