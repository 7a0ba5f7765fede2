"""One line about a failure: what a seal records as its ``error``, and what the log says when
a listener, the shipper or the summary fails (never a traceback, never a second line)."""

from __future__ import annotations

from prime_runs_spool.content.mask_text import mask_text

#: A seal's ``error`` is one line of at most this many characters.
ERROR_MAX_CHARS = 500


def describe_error(error: BaseException | str) -> str:
    """``Type: message`` on one line, truncated: what a seal records about a failure. A
    seal travels (the evaluation's metadata and error message) and a message may quote a
    URL with its credentials (a ``git clone https://user:token@...`` that failed), so what a
    config's strings have masked (a URL's userinfo and query, a flag's value) is masked here."""
    if isinstance(error, BaseException):
        message = str(error)
        text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    else:
        text = str(error)
    text = mask_text(" ".join(text.split()))
    if len(text) > ERROR_MAX_CHARS:
        text = text[: ERROR_MAX_CHARS - 3] + "..."
    return text
