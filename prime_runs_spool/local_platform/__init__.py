"""A local, SQLite-backed implementation of the platform's evaluations API.

It exists so that sync's exactly-once claims can be checked against a server with the real
platform's unkind semantics (appends never deduplicate, create and finalize are not
idempotent), and so that ``prime-runs sync --local`` works on a machine with no account.

- ``store``  – durable state: SQLite in WAL mode, one connection per thread
- ``app``    – the Starlette app: HTTP routes, validation, auth, the body-size limit
- ``server`` – running the app with uvicorn, as a process or embedded in a thread

The folder's ``__init__`` imports nothing: the server stack (Starlette, uvicorn) costs a
tenth of a second, which a command that does not serve must not pay. Import the module you
need (``local_platform.server``, ``local_platform.store``).
"""
