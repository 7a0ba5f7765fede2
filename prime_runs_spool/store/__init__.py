"""Spools in an object store (``s3://``, ``gs://``, ``az://``, ``file://``), read where they lie.

A layer of its own, above ``spool/`` and below everything that ships: it knows objects, byte
ranges and conditional writes, and which keys form a run (by ``spool/layout.py``'s names),
but nothing of sync's protocol. ``objects`` wraps the store library, ``source`` makes a run
in the store readable by the ordinary reader, ``lease`` is the lock a syncer holds on a run,
``mirror`` copies local spools in (up to their durable mark), ``verify`` checks them there.
"""
