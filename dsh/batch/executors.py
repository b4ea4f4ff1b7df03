"""Where a batch's tasks run: the executor protocol, the built-in threads, remote units.

:class:`Executor` is what a ``batch_executor`` hook returns; :class:`LocalExecutor` is the
built-in ``local`` one (threads in this process) and :func:`get_executor` picks one by name. A
:class:`RemoteExecutor` (dsh-ray) runs each attempt elsewhere as a :class:`Unit` — plain,
picklable data a worker runs with :func:`run_unit` — and sends back :func:`result_data`, which
:func:`result_from_data` turns into a ``RunResult`` again; a dead worker is :class:`WorkerLost`.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Protocol

import attrs

from dsh.batch.tasks import Task
from dsh.core.errors import DshError
from dsh.core.errors import UsageError
from dsh.host.runcontext import Budget
from dsh.host.runcontext import Limits

if TYPE_CHECKING:
    from dsh.config.loader import Config
    from dsh.host.runcontext import RunContext
    from dsh.run.app import App
    from dsh.run.app import RunResult

class Executor(Protocol):
    """What a ``batch_executor`` hook returns (docs/batch.md, "Executors")."""

    def run(self, job: Callable[[Task], Any], tasks: Iterator[Task], *,
            workers: int) -> Iterator[Any]:
        """Call ``job(task)`` for each task, at most ``workers`` at once; take the next task
        from ``tasks`` only when a slot is free (the batch stops starting tasks by ending
        the iterator); yield each job's return value as it finishes, in any order; return
        once every started job has finished. ``job`` never raises."""
        ...

    def close(self) -> None:
        """Release what the executor holds (called once, after :meth:`run`)."""
        ...


class RemoteExecutor(Executor, Protocol):
    """An executor whose tasks run in other processes (dsh-ray; docs/batch.md, "Executors").

    ``job(task)`` still runs in the driver (its :meth:`run` may be :class:`LocalExecutor`'s):
    there the batch journals the attempt's session *before* dispatch, then calls
    :meth:`dispatch` with a :class:`Unit` — plain data a worker runs with :func:`run_unit` —
    and keeps the results, the journal, progress and the session store.
    """

    def dispatch(self, unit: Unit) -> dict[str, Any]:
        """Run ``unit`` elsewhere and return what :func:`run_unit` returned there; raise
        :class:`WorkerLost` when the process running it died (the batch then closes the
        partial ledger as interrupted and runs the task again, in a new session)."""
        ...

    def shared_budget(self, limits: Limits) -> Budget:
        """The batch's budget: a :class:`~dsh.host.runcontext.Budget` every worker's runs reserve
        against (a level with ``remote = True``), readable in the driver."""
        ...

    def stop(self, reason: str, *, abort: bool) -> None:
        """The batch is stopping: running units end after their step (``abort``: now)."""
        ...


class LocalExecutor:
    """The built-in executor: threads in this process (model calls are I/O bound)."""

    def run(self, job: Callable[[Task], Any], tasks: Iterator[Task], *,
            workers: int) -> Iterator[Any]:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dsh-batch") as pool:
            running: set[Future[Any]] = set()
            more = True
            while True:
                while more and len(running) < workers:
                    task = next(tasks, None)
                    if task is None:
                        more = False
                        break
                    running.add(pool.submit(contextvars.copy_context().run, job, task))
                if not running:
                    return
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()

    def close(self) -> None:
        pass


class WorkerLost(DshError):
    """The process running a :class:`Unit` died (a remote executor's :meth:`dispatch`)."""


@attrs.frozen
class Unit:
    """One attempt of one task as a remote executor ships it: plain, picklable data.

    The driver has journalled ``session`` before the unit is dispatched, so a worker that dies
    leaves a ledger the driver knows about.
    """

    #: The driver's configuration (a literal ``api_key`` in it travels with it; keys in the
    #: environment do not).
    config: Config
    #: The driver's session directory, when its store has one (the worker writes there:
    #: a filesystem shared with the driver); None: the config's own store.
    store: str | None
    task: Task
    #: The agent's name and overrides (``-m``, ``-o``, the task's own).
    agent: str | None
    overrides: dict[str, Any]
    #: ``--task-limit``.
    limits: Limits | None
    session: str
    #: ``session`` is new (created with this id); else an existing one continued.
    create: bool
    approve: bool = False


_WORKER_APPS: dict[str, App] = {}
_WORKER_LOCK = threading.Lock()


def run_unit(unit: Unit, *, budget_parent: Budget | None = None,
             context_hook: Callable[[RunContext], None] | None = None) -> dict[str, Any]:
    """Run ``unit`` in this process (a remote executor's worker): an :class:`App` built from
    its config (one per config and process, reused), its session opened, the task sent.
    Returns the :class:`~dsh.run.app.RunResult` as plain data (:func:`result_data`); never
    raises for the task's own failures."""
    from dsh.run.app import App
    from dsh.run.app import RunResult
    from dsh.run.app import describe_error

    config = unit.config
    if unit.store is not None:
        config = attrs.evolve(config, sessions_dir=unit.store)
    key = repr(config)
    with _WORKER_LOCK:
        app = _WORKER_APPS.get(key)
        if app is None:
            app = _WORKER_APPS[key] = App(config)
    try:
        agent = app.agent(unit.agent, **unit.overrides)
        session = app.open_session(agent, unit.session, create=unit.create)
    except Exception as exc:
        return result_data(RunResult(output="", session_id=unit.session, outcome="error",
                                     reason=describe_error(app.pm, exc)))
    with session:
        result = session.send(unit.task.text, limits=unit.limits, budget_parent=budget_parent,
                              context_hook=context_hook, approve=unit.approve)
    return result_data(result)


def result_data(result: RunResult) -> dict[str, Any]:
    """A :class:`~dsh.run.app.RunResult` as plain data (its ``error`` is in ``reason``)."""
    return {"output": result.output, "session_id": result.session_id,
            "outcome": result.outcome, "reason": result.reason, "steps": result.steps,
            "usage": attrs.asdict(result.usage),
            "path": str(result.path) if result.path is not None else None,
            "context": result.context, "value": result.value, "cost": result.cost}


def result_from_data(data: dict[str, Any]) -> RunResult:
    """The :class:`~dsh.run.app.RunResult` :func:`result_data` made ``data`` of."""
    from dsh.core.messages import Usage
    from dsh.run.app import RunResult

    return RunResult(output=data["output"], session_id=data["session_id"],
                     outcome=data["outcome"], reason=data["reason"], steps=data["steps"],
                     usage=Usage(**data["usage"]),
                     path=Path(data["path"]) if data["path"] else None,
                     context=data["context"], value=data["value"],
                     cost=data.get("cost"))  # a worker of an older dsh sends none


def get_executor(app: App, name: str) -> Executor:
    """The executor ``name``: a plugin's (``batch_executor`` hook), else the built-in
    ``local``; an unknown name is a :class:`UsageError`."""
    found = app.pm.hook.batch_executor(name=name, app=app)
    if found is not None:
        return found
    if name == "local":
        return LocalExecutor()
    raise UsageError(f"--executor: no executor {name!r} (built in: local; plugins add others "
                     "through the batch_executor hook)")
