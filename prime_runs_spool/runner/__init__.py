"""The eval runner's side: ``open_run`` and ``Run`` (``run``: admission, numbering, the
public API), how a run ends (``ending``: finish, abort, the exit hook), its durable listeners
(``listeners``), supervising the online shipper (``shipping``), continuing a run (``resume``),
the spool modes (``modes``), the verifiers adapter (``verifiers``) and the online mode's
shipper process (``online``, which starts ``python -m prime_runs_spool.sync`` and reads only
the sync state file)."""
