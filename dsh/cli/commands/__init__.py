"""Built-in ``dsh`` commands that live outside :mod:`dsh.cli`, one concern per module.

:mod:`dsh.cli` keeps the root group, the global options, ``run`` and the helpers several
commands share (``State``, ``warn``, option parsing and agent assembly, session lookup); it
imports the modules here only when one of their commands is asked for (or listed by
``dsh --help``), through :data:`dsh.cli.root.LAZY_COMMANDS`: ``dsh run`` imports none of them. Each
module imports nothing but click and :mod:`dsh.cli` at import time.

* :mod:`dsh.cli.commands.sessions` — ``sessions list/show/compact/export/path/rm``;
* :mod:`dsh.cli.commands.config` — ``config path/show/init/set/validate``;
* :mod:`dsh.cli.commands.chat` — ``chat`` (the chat itself: :mod:`dsh.chat`);
* :mod:`dsh.cli.commands.batch` — ``batch`` (running the tasks: :mod:`dsh.batch`);
* :mod:`dsh.cli.commands.inventory` — ``plugins``, ``tools``, ``models`` (and ``models alias``),
  ``agents``;
* :mod:`dsh.cli.commands.doctor` — ``doctor`` (the checks: :mod:`dsh.cli.doctor_checks`);
* :mod:`dsh.cli.commands.install` — ``install``, ``uninstall`` (pip into dsh's environment);
* :mod:`dsh.cli.commands.keys` — ``keys`` (stored API keys);
* :mod:`dsh.cli.commands.replay` — ``replay`` (the driver: :mod:`dsh.run.replay`).
"""
