"""Exactly-once shipping of spools to a platform (docs/sync.md).

``state`` is what sync remembers beside each spool (``typed_json`` checks it as it is
read), ``rows`` turns a spool into request bodies, ``protocol`` is the exactly-once core
(announce, send once, settle, fence), ``evaluation`` finds or creates the run's
evaluation, ``reconcile`` matches our samples with the platform's, ``engine`` runs one
run's pass (``options`` says what to do and reports what was done), ``many`` finds runs and
syncs many, ``follow`` keeps following live spools, ``status`` reports offline,
``__main__`` is the entry point the online shipper runs (``python -m prime_runs_spool.sync``).
"""
