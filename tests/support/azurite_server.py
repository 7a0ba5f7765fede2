"""Azure's blob API on loopback for the ``az://`` tests: Azurite (npm), as a subprocess.

tests/setup.sh installs a pinned Azurite into ``.cache/azurite`` (Node from Debian). Started
with ``--blobPort 0`` it picks a free port and says which; ``--disableTelemetry`` keeps it
from calling out (nothing leaves the machine); ``--inMemoryPersistence`` writes no files.
The account is Azurite's built-in development account, whose key is public (Microsoft
documents it for the emulator): the store library uses it when told it talks to the
emulator (``AZURE_STORAGE_USE_EMULATOR``). The library creates no container, so
:meth:`AzuriteServer.new_container` does, with a request signed by that key.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from support import loopback_server
from support.loopback_server import environment

ROOT = Path(__file__).resolve().parents[2]
#: Where tests/setup.sh installs it (gitignored).
AZURITE_BIN = ROOT / ".cache" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
#: Azurite's well-known development key (public, the same for every install).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
API_VERSION = "2021-08-06"


def installed() -> bool:
    return AZURITE_BIN.exists()


@dataclass
class AzuriteServer:
    proc: subprocess.Popen[str]
    endpoint: str  # http://127.0.0.1:PORT

    def env(self) -> dict[str, str]:
        """What points the store library at this server."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.endpoint,
                "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": ACCOUNT_KEY,
                "AZURE_ALLOW_HTTP": "true"}

    def new_container(self) -> str:
        """A new empty container (the Blob API's "Create Container", signed with the key)."""
        name = f"c-{uuid.uuid4().hex[:12]}"
        date = email.utils.formatdate(usegmt=True)
        canonical = (f"PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{API_VERSION}\n"
                     f"/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container")
        signature = base64.b64encode(hmac.new(base64.b64decode(ACCOUNT_KEY), canonical.encode(),
                                              hashlib.sha256).digest()).decode()
        answer = httpx.put(f"{self.endpoint}/{ACCOUNT}/{name}", params={"restype": "container"},
                           headers={"x-ms-date": date, "x-ms-version": API_VERSION,
                                    "Authorization": f"SharedKey {ACCOUNT}:{signature}"})
        answer.raise_for_status()
        return name


@contextmanager
def running() -> Iterator[AzuriteServer]:
    with loopback_server.running("Azurite", [str(AZURITE_BIN), "--blobHost", "127.0.0.1", "--blobPort", "0",
                                             "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck",
                                             "--loose"],
                                 r"listens on (http://127\.0\.0\.1:\d+)") as (proc, endpoint):
        yield AzuriteServer(proc, endpoint)


def module_fixture() -> object:
    """A module-scoped ``azurite`` fixture, skipping the module's tests when tests/setup.sh
    has not installed Azurite; its settings in this process's environment too."""
    import pytest

    @pytest.fixture(scope="module", name="azurite")
    def azurite() -> Iterator[AzuriteServer]:
        if not installed():
            pytest.skip(f"Azurite is not installed at {AZURITE_BIN}: run tests/setup.sh")
        with running() as server, environment(server.env()):
            yield server

    return azurite
