"""A TCP port on 127.0.0.1 that nothing listens on (free to bind, or to find closed)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
