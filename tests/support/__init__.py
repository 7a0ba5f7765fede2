"""Helpers shared by the tests, imported as ``from support.NAME import ...``.

- ``env``             – this checkout's root, the child-process environment, the CLI argv
- ``episodes``        – the small episode factory of the run API's tests (the sized one is
                        ``fixtures.episodes.make_episode``, shared with the benchmarks)
- ``files``           – every file under a folder, and all their bytes
- ``segments``        – spool bytes built by hand (for reader and framing tests)
- ``runs``            – whole runs written through the segment writer (for sync tests)
- ``sync_e2e``        – the local platform fixture, the sync command line, exactly-once checks
- ``fake_platform``   – an in-memory platform behind ``httpx.MockTransport``
- ``platform_process`` – the local platform started as a real process
- ``crash_writer``    – a writer process for SIGKILL tests
- ``loop_ticker``     – proves an event loop kept running
- ``children``        – child processes stopped with SIGINT, and never left running
- ``store_runs``      – runs in a store, and the mirror / sync / verify steps every store test takes
- ``loopback_server`` – a server subprocess on loopback (moto, Azurite): started, waited for, stopped
- ``browser``         – chromium for the viewer's tests, and the ``browser`` and ``page`` fixtures
"""
