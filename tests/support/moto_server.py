"""A real S3 API on loopback for the object-store tests: moto's server mode, as a subprocess.

``python -m moto.server -H 127.0.0.1 -p 0`` picks a free port and says which on stderr;
nothing leaves the machine. Each test makes its own bucket (:func:`new_bucket`), so one
server serves a whole module. ``store_env`` is the environment a child process (or the
library in this process) needs to reach it: the library reads the usual ``AWS_*`` variables.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from support import loopback_server
#: Kept here too: the tests call it ``moto_server.environment``.
from support.loopback_server import environment


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
    with loopback_server.running("moto's server", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
                                 r"Running on (http://127\.0\.0\.1:\d+)") as (proc, endpoint):
        yield MotoServer(proc, endpoint)


def module_fixture() -> object:
    """A module-scoped ``moto`` fixture: one S3 server for a test file, its endpoint and
    credentials in this process's environment too (``moto = moto_server.module_fixture()``)."""
    import pytest

    @pytest.fixture(scope="module", name="moto")
    def moto() -> Iterator[MotoServer]:
        with running() as server, environment(server.env()):
            yield server

    return moto
