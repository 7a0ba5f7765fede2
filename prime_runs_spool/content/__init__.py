"""What a run carries, independent of how it is stored or shipped: credentials masked by
location (``masking``), the manifest (``manifest``), run metrics (``summary``) and what an
episode record is (``episodes``: ids, rollout numbers, rewards)."""
