"""``paratrain serve``: the container's entrypoint — Jupyter and SSH, or your command.

    paratrain serve                                   # JupyterLab on 8888 (token), sshd on 2222
    paratrain serve paratrain run --nproc 4 train.py  # run this instead (it replaces serve, so
                                                      # SIGTERM goes straight to it)
    paratrain serve --bind 127.0.0.1 --no-ssh --jupyter-port 18888

Jupyter always needs a token: ``JUPYTER_TOKEN`` (16 characters or more), or, when it is unset
or empty, a generated one printed once. sshd takes public keys only — from
``SSH_AUTHORIZED_KEYS`` (the lines of a .pub file) or a mounted ``/run/secrets/authorized_keys``
/ ``~/.ssh/authorized_keys`` — never passwords, never root; without a key it does not start.
Both run as this (non-root) user.
SIGTERM or SIGINT stops both and exits 0; if one server dies, the other is stopped and serve
exits 1 naming it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType

from paratrain.commands.serve.servers import (
    Server,
    Settings,
    check_port,
    jupyter_server,
    ssh_server,
)
from paratrain.errors import ConfigError

DEFAULT_KEY_FILES = (Path("/run/secrets/authorized_keys"), Path("~/.ssh/authorized_keys"))
STOP_GRACE_S = 10.0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paratrain serve``."""
    env = os.environ
    p = subparsers.add_parser(
        "serve",
        help="the container entrypoint: Jupyter (token) and SSH (keys only), or a command",
        description=__doc__.split("\n")[0],
    )
    p.add_argument(
        "--bind",
        default=env.get("PARATRAIN_BIND", "0.0.0.0"),
        help="address both servers listen on (default $PARATRAIN_BIND or 0.0.0.0)",
    )
    # String defaults go through `type` too, so a bad $JUPYTER_PORT is a usage error.
    p.add_argument(
        "--jupyter-port",
        type=int,
        default=env.get("JUPYTER_PORT", "8888"),
        help="Jupyter's port (default $JUPYTER_PORT or 8888)",
    )
    p.add_argument(
        "--ssh-port",
        type=int,
        default=env.get("SSH_PORT", "2222"),
        help="sshd's port (default $SSH_PORT or 2222; above 1023: no root needed)",
    )
    p.add_argument("--no-jupyter", action="store_true", help="do not start Jupyter")
    p.add_argument("--no-ssh", action="store_true", help="do not start sshd")
    p.add_argument(
        "--root-dir",
        type=Path,
        default=None,
        help="Jupyter's folder (default /workspace when it exists, else here)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path("~/.paratrain-serve"),
        help="sshd's host key and config (keep it on a volume to keep the host key)",
    )
    p.add_argument(
        "--authorized-keys",
        type=Path,
        action="append",
        default=None,
        help="file of public keys (repeatable; default /run/secrets/authorized_keys "
        "and ~/.ssh/authorized_keys when they exist)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="a command to run instead of the servers")  # fmt: skip
    p.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Exec the command, or start the servers and watch them until a signal."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command:
        try:
            os.execvp(command[0], command)
        except (OSError, ValueError) as err:
            why = err.strerror if isinstance(err, OSError) else str(err)
            raise ConfigError(
                f"paratrain serve: cannot run {command[0]!r} ({why}). Check the command's name "
                "and that it is installed in the image."
            ) from None
    if os.geteuid() == 0:
        raise ConfigError(
            "paratrain serve does not serve Jupyter and SSH as root: a notebook or a login "
            "would own the machine. Run the image as its own user (leave out --user root / "
            "`docker exec -u root`), or run your command through it instead: paratrain serve "
            "CMD."
        )
    servers = _servers(args)
    if not servers:
        raise ConfigError(
            "paratrain serve has nothing to serve: Jupyter is off (--no-jupyter) and SSH has "
            "no key or is off. Drop --no-jupyter, or give a key with SSH_AUTHORIZED_KEYS."
        )
    return _supervise(servers)


def _servers(args: argparse.Namespace) -> list[Server]:
    root = args.root_dir or (Path("/workspace") if Path("/workspace").is_dir() else Path.cwd())
    try:
        found = root.is_dir()
    except OSError:  # a name too long for the file system
        found = False
    if not found:
        raise ConfigError(
            f"--root-dir {root}: no such folder. Pass an existing folder for Jupyter."
        )
    key_files = args.authorized_keys or [p.expanduser() for p in DEFAULT_KEY_FILES]
    for path in args.authorized_keys or ():
        try:
            found = path.is_file()
        except OSError:  # a name too long for the file system
            found = False
        if not found:
            raise ConfigError(f"--authorized-keys {path}: no such file. Mount it, or leave it out.")
    try:
        args.state_dir.expanduser().exists()
    except OSError as err:  # a name too long for the file system
        raise ConfigError(
            f"--state-dir cannot be used ({err.strerror}). Choose a shorter, plain folder path."
        ) from None
    settings = Settings(
        bind=args.bind,
        jupyter_port=None if args.no_jupyter else check_port("--jupyter-port", args.jupyter_port),
        ssh_port=None if args.no_ssh else check_port("--ssh-port", args.ssh_port),
        root_dir=root,
        state_dir=args.state_dir.expanduser(),
        authorized_keys=key_files,
        keys_from_env=os.environ.get("SSH_AUTHORIZED_KEYS", ""),
        token=os.environ.get("JUPYTER_TOKEN") or None,  # empty (compose's default): generate
    )
    servers = [] if args.no_jupyter else [jupyter_server(settings)]
    ssh = None if args.no_ssh else ssh_server(settings)
    if ssh is not None:
        servers.append(ssh)
    elif not args.no_ssh:
        print("paratrain serve: SSH is off: no public key was given (set SSH_AUTHORIZED_KEYS or "
              "mount /run/secrets/authorized_keys)", flush=True)  # fmt: skip
    return servers


def _supervise(servers: list[Server]) -> int:
    stop: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    running: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for server in servers:
            running[server.name] = subprocess.Popen(
                server.argv, env={**os.environ, **server.env}, start_new_session=True
            )
            for note in server.notes:
                print(f"paratrain serve: {note}", flush=True)
        while not stop:
            for name, proc in running.items():
                code = proc.poll()
                if code is not None:
                    print(f"paratrain serve: {name} stopped by itself (exit code {code}); "
                          "stopping the rest", file=sys.stderr, flush=True)  # fmt: skip
                    return 1
            time.sleep(0.2)
        print(f"paratrain serve: {signal.Signals(stop[0]).name}: stopping "
              f"{', '.join(running)}", flush=True)  # fmt: skip
        return 0
    finally:
        _stop(running.values())


def _stop(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each server's process group, then SIGKILL after the grace period."""
    alive = [p for p in procs if p.poll() is None]
    for proc in alive:
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in alive:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
