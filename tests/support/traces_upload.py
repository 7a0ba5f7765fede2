"""One Prime Traces upload against an answer a test makes up (``httpx.MockTransport``): what
sync's uploader (platform_api/traces.py) makes of it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import httpx
import pytest

from prime_runs_spool.errors import PlatformError

#: The one line of the batch every such upload sends.
LINE = b'{"id":"e1","traces":[]}\n'


def upload_refused(answer: Callable[[httpx.Request], httpx.Response], *, base_url: str = "http://traces.test:8443",
                   api_key: str = "sk-test-key-value") -> PlatformError:
    """The error an upload of a one-line batch to ``base_url`` raises, each request answered
    by ``answer`` (the test fails if the upload succeeds)."""
    from prime_traces.batching import Batch

    from prime_runs_spool.platform_api.traces import TracesUploader

    batch = Batch(data=LINE, digest=hashlib.sha256(LINE).hexdigest(), num_lines=1, first_line_number=1)
    uploader = TracesUploader(base_url, api_key, None, transport=httpx.MockTransport(answer))
    try:
        with pytest.raises(PlatformError) as caught:
            uploader.upload(batch, {})
    finally:
        uploader.close()
    return caught.value
