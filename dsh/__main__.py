"""``python -m dsh``: the ``dsh`` command."""

from dsh.cli import main

main()
