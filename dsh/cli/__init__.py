"""The ``dsh`` command line (docs/cli.md): thin click commands over :class:`dsh.App`.

``root`` (the root group, its global options, the console script), ``run_command``
(``dsh run``), ``shared`` (``State`` and the ``dsh:`` lines every command writes), ``options``
(what ``-L -o -m -s -T -c --session`` turn into), ``commands/`` (every other built-in command,
one concern per module, imported only when used), ``terminal`` (what ``dsh run`` prints while it
runs, and its signals) built from ``status`` (the status line), ``streams`` (stdout, streamed
text) and ``escape`` (text made safe for a terminal), ``render`` (views of a session),
``inventories`` (``dsh plugins/tools/models/agents``), ``repl`` (``dsh chat``) and
``chat_commands`` (its ``/`` commands).

May import: anything in dsh. Nothing below imports it.

``dsh.cli`` was one module before 0.3: its names (``main``, ``cli``, ``State``…) still resolve
here, from :mod:`dsh.cli.root`, deprecated (CHANGELOG.md's deprecation policy).
"""

from dsh._compat import package_getattr

__getattr__ = package_getattr(
    __name__, "dsh.cli.root",
    frozenset({"root", "run_command", "shared", "options", "commands", "terminal", "status",
               "streams", "escape", "render", "inventories", "repl", "chat_commands"}))
