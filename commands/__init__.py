"""The ``prime-runs`` command line: thin click commands over the ``prime_runs_spool`` library."""
