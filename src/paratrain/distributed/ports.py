"""TCP ports on this machine: is one free, and which one is.

port_is_free("127.0.0.1", 29500)
free_port()          # a port the OS says is unused right now
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port that nothing is bound to at this moment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True when ``port`` can be bound (on loopback for local hosts, else on all interfaces)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1" if host in ("127.0.0.1", "localhost") else "", port))
        except (OSError, OverflowError):
            return False
    return True
