"""``dsh batch``: many agent runs from a JSON Lines file — resumable, budgeted, concurrent.

Modules, in the order a batch uses them: ``tasks`` (the tasks file, each line validated before
any task starts), ``journal`` (the journal, the results file, recovery of a killed batch from
them), ``executors`` (the executor protocol, the built-in threads, remote units and their
worker side), ``progress`` (the progress line, the summary and the signals) and ``runner`` (the
batch itself and :func:`~dsh.batch.runner.run_batch`).

May import: :mod:`dsh.run` and everything below it. Never :mod:`dsh.cli` at import time.

``dsh.batch`` was one module before 0.3: its names still resolve here, deprecated (from
``runner``, which still gives every name it had before it was split).
"""

from dsh._compat import package_getattr

__getattr__ = package_getattr(
    __name__, "dsh.batch.runner",
    frozenset({"runner", "tasks", "journal", "executors", "progress"}))
