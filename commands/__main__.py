"""``python -m commands``: the same as the ``prime-runs`` console script."""

from .entry import main

main()
