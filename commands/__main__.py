"""``python -m commands``: the same as the ``prime-runs`` console script."""

from commands.cli import main

main()
