"""Results as tables: ``prime-runs export``, ``samples_df`` and ``runs_df`` (docs/cli.md)."""
