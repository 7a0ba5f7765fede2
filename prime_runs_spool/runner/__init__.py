"""The eval runner's side: ``open_run`` and ``Run`` (``run``), continuing a run (``resume``),
the spool modes (``modes``), the verifiers adapter (``verifiers``) and the online mode's
shipper (``online``, which starts ``python -m prime_runs_spool.sync`` and reads only the
sync state file)."""
