"""``python -m dsh``: the ``dsh`` command."""

from dsh.cli.root import main

main()
