"""What ``prime-runs eval`` lets verifiers print, cleared of the credentials the spool masks.

verifiers runs in our process (``verifiers_eval``), and prints to ``sys.stdout`` and
``sys.stderr``: with ``--no-rich`` every trace as JSON at the end, the seat's client config
(a launch file's ``[client] headers`` value) included; its log lines; its dashboard. The
spool masks those values by location before they reach the disk, so the terminal (and a CI
log that keeps it) must not show them either.

So, for the eval, both streams are replaced by a :class:`MaskedStream` that replaces each
value masking took out of the run's config (the same plan the manifest is written with:
``content/manifest.masked_config_values``, as an error message may quote it:
``content/error_scrub.error_forms``) by the mask, in every text written, before it reaches
the real stream. Everything else (``isatty``, ``fileno``, the encoding) is the real stream's,
so verifiers' dashboard still sees a terminal. The values are known once the run is opened
(its config parsed); before that, those of the launch file itself, read as the config it
becomes.

What it cannot reach (docs/integration.md, "What the terminal shows"): a value split across
two writes, bytes written to ``sys.stdout.buffer`` or to the file descriptors directly, and
the output of child processes (a harness run by ``uv``).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TextIO

from prime_runs_spool.content.error_scrub import error_forms, scrub_text
from prime_runs_spool.content.manifest import masked_config_values

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


#: Read of a launch file, at most: a config is a few KB; the run's own config, once opened,
#: is masked whatever its size.
MAX_LAUNCH_FILE_BYTES = 4 * 1024 * 1024


class TerminalMask:
    """The forms of the secret values found so far, longest first, shared by both streams."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.forms: list[str] = []

    def add(self, forms: Iterable[str]) -> None:
        with self._lock:
            merged = set(self.forms) | set(forms)
            self.forms = sorted(merged, key=len, reverse=True)  # a longer form replaced whole first

    def add_launch_file(self, path: str | None) -> None:
        """The values masking takes out of the launch file read as a config: printed before
        the run opens (a validation error quoting one) they are masked too. A file that
        cannot be read or parsed is verifiers' to report."""
        if path is None:
            return
        try:
            with open(path, "rb") as handle:
                text = handle.read(MAX_LAUNCH_FILE_BYTES)
            # verifiers' resolved config (what a resume is launched from) is JSON
            config = json.loads(text) if path.lower().endswith(".json") else tomllib.loads(text.decode("utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(config, dict):
            self.add(error_forms(masked_config_values(config)))

    def clear(self, text: str) -> str:
        forms = self.forms
        return scrub_text(text, forms) if forms else text


class MaskedStream:
    """A text stream writing through ``mask``; every other attribute is the real stream's."""

    def __init__(self, stream: TextIO, mask: TerminalMask) -> None:
        self._stream = stream
        self._mask = mask

    def write(self, text: str) -> int:
        self._stream.write(self._mask.clear(text))
        return len(text)  # what the caller gave: a shorter count would make it write again

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def masked_terminal(mask: TerminalMask) -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` written through ``mask`` for the block, then restored."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = MaskedStream(saved[0], mask), MaskedStream(saved[1], mask)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
