"""Exactly-once shipping of spools to a platform (docs/sync.md).

``state`` is what sync remembers beside each spool, ``batches`` turns a spool into request
bodies, ``engine`` runs the protocol for one run, ``runner`` finds runs and syncs many.
"""
