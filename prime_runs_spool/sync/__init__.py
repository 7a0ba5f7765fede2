"""Exactly-once shipping of spools to a platform (docs/sync.md).

``state`` is what sync remembers beside each spool, ``rows`` turns a spool into request
bodies, ``engine`` runs the protocol for one run, ``many`` finds runs and syncs many,
``follow`` keeps following live spools, ``status`` reports offline, ``__main__`` is the
entry point the online shipper runs (``python -m prime_runs_spool.sync``).
"""
