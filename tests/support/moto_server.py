"""A real S3 API on loopback for the object-store tests: moto's server mode, as a subprocess.

``python -m moto.server -H 127.0.0.1 -p 0`` picks a free port and says which on stderr;
nothing leaves the machine. Each test makes its own bucket (:func:`new_bucket`), so one
server serves a whole module. ``store_env`` is the environment a child process (or the
library in this process) needs to reach it: the library reads the usual ``AWS_*`` variables.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

STARTUP_TIMEOUT = 30.0


@dataclass
class MotoServer:
    proc: subprocess.Popen[str]
    endpoint: str

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """The ``AWS_*`` settings that point the store library at this server (or at a proxy
        in front of it)."""
        return {"AWS_ENDPOINT_URL": endpoint or self.endpoint, "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": "us-east-1", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
                "AWS_EC2_METADATA_DISABLED": "true"}

    def new_bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        httpx.put(f"{self.endpoint}/{name}").raise_for_status()
        return name


@contextmanager
def running() -> Iterator[MotoServer]:
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found: list[str] = []
    seen = threading.Event()

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
            if match and not found:
                found.append(match.group(1))
                seen.set()
        seen.set()

    threading.Thread(target=watch, daemon=True).start()
    if not seen.wait(STARTUP_TIMEOUT) or not found:
        proc.kill()
        raise AssertionError("moto's server did not start")
    try:
        yield MotoServer(proc, found[0])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in this process's environment for the block (the library reads it)."""
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def module_fixture() -> object:
    """A module-scoped ``moto`` fixture: one S3 server for a test file, its endpoint and
    credentials in this process's environment too (``moto = moto_server.module_fixture()``)."""
    import pytest

    @pytest.fixture(scope="module", name="moto")
    def moto() -> Iterator[MotoServer]:
        with running() as server, environment(server.env()):
            yield server

    return moto
