"""Built-in ``dsh`` commands that live outside :mod:`dsh.cli`, one concern per module.

:mod:`dsh.cli` keeps the root group, ``run``/``chat``/``batch``, ``sessions`` and ``config``;
it imports the modules here only when one of their commands is asked for (or listed by
``dsh --help``), through :data:`dsh.cli.LAZY_COMMANDS`. Each module imports nothing but click
and :mod:`dsh.cli` at import time.

* :mod:`dsh.commands.inventory` — ``plugins``, ``tools``, ``models``, ``agents``;
* :mod:`dsh.commands.install` — ``install``, ``uninstall`` (pip into dsh's environment);
* :mod:`dsh.commands.keys` — ``keys`` (stored API keys).
"""
