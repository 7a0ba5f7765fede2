"""Addresses on this machine that a test needs to behave a known way."""

from __future__ import annotations

import socket


def closed_port() -> int:
    """A port nobody listens on: bound to find a free one, then closed, so every connection
    to it is refused at once (nothing else on a test machine takes a port it did not ask
    for in the moments between)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def closed_url() -> str:
    """An ``http`` address at :func:`closed_port`: every request to it is refused a connection."""
    return f"http://127.0.0.1:{closed_port()}"
