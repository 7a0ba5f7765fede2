"""Importing eval outputs written without a spool (``prime-runs import``, docs/integration.md).

A layer above ``runner/``: an import writes its spool through ``open_run``, so the spool is
exactly what a live run would have written.

- ``paths``       – the names of what an eval writes and of the import's own files
- ``source``      – a verifiers 0.4.0 run folder: ``traces.jsonl``, ``configs/``, ``logs/``
- ``v0_layout``   – the older ``metadata.json`` + ``results.jsonl`` layout
- ``traces_file`` – the strict line rules of a results file (torn tail, bad middle line)
- ``outcome``     – how the run ended, from what verifiers left on disk
- ``places``      – where an imported spool lives (beside the source or under --state-dir)
- ``options``     – the --state-dir setting, cheap to import for the command line
- ``outputs``     – importing a folder: the spool written, incrementally and idempotently
"""
