"""A test server as a child process on loopback: started, waited for, stopped.

The servers the store tests use (moto for S3, Azurite for Azure's blob API) are told to
listen on port 0: the kernel picks a free port and the server names the address it got in
a line of its output. Reading that line, rather than choosing a port first and handing it
over, leaves no window in which another process on the machine takes the port.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

#: How long a server may take to say where it listens (a loaded 2-core machine is slow).
STARTUP_TIMEOUT = 30.0
#: How long a server may take to stop once asked, before it is killed.
STOP_TIMEOUT = 10.0
#: How many of its last output lines a server that never came up is shown with.
OUTPUT_SHOWN = 20


class ServerDidNotStart(RuntimeError):
    """The server exited, or named no address before the deadline."""


@contextmanager
def running(name: str, argv: Sequence[str], address: str,
            timeout: float = STARTUP_TIMEOUT) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Start ``argv``, wait until a line of its output matches ``address`` (a pattern whose
    first group is the base URL), and yield the process and that URL; stop it afterwards.

    Its output is read to the end by a thread of its own, so a chatty server never blocks on
    a full pipe. A server that exits or stays silent is killed, and the error names it, its
    exit code and its last lines of output."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found: list[str] = []
    last_lines: deque[str] = deque(maxlen=OUTPUT_SHOWN)
    seen = threading.Event()

    def watch() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not found:
                last_lines.append(line.rstrip())
                match = re.search(address, line)
                if match:
                    found.append(match.group(1))
                    seen.set()
        seen.set()  # the output ended: the server exited

    threading.Thread(target=watch, daemon=True, name=f"{name} output").start()
    if not seen.wait(timeout) or not found:
        ended = seen.is_set()  # its output ended: it exited on its own
        proc.kill()
        code = proc.wait()
        why = f"exited with code {code}" if ended else f"was silent for {timeout:g} s"
        said = "\n".join(last_lines) or "(nothing)"
        raise ServerDidNotStart(f"{name} {why} before saying where it listens; its last output:\n{said}")
    try:
        yield proc, found[0]
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[str]) -> None:
    """Ask the server to stop; kill it if it has not within :data:`STOP_TIMEOUT`."""
    proc.terminate()
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in this process's environment for the block (the store library reads
    a server's address and credentials from there)."""
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
