"""``dsh batch``: many agent runs from a JSON Lines file — resumable, budgeted, concurrent.

``runner`` (tasks, the journal, the results file, executors, the progress line, signals and
the batch itself).

May import: :mod:`dsh.run` and everything below it. Never :mod:`dsh.cli` at import time.

``dsh.batch`` was one module until 0.4: its names still resolve here, for one release.
"""

from dsh._compat import package_getattr

__getattr__ = package_getattr(__name__, "dsh.batch.runner", frozenset({"runner"}))
