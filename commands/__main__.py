"""``python -m commands``: the same as the ``prime-runs`` console script."""

from .cli import main

main()
