"""A local, SQLite-backed implementation of the platform's evaluations API.

It exists so that sync's exactly-once claims can be checked against a server with the real
platform's unkind semantics (appends never deduplicate, create and finalize are not
idempotent), and so that ``prime-runs sync --local`` works on a machine with no account.

- ``store``  – durable state: SQLite in WAL mode, one connection per thread
- ``app``    – the Starlette app: HTTP routes, validation, auth, the body-size limit
- ``server`` – running the app with uvicorn, as a process or embedded in a thread
"""

from prime_runs_spool.local_platform.server import EmbeddedPlatform
from prime_runs_spool.local_platform.store import Store

__all__ = ["EmbeddedPlatform", "Store"]
