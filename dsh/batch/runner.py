"""``dsh batch``: many agent runs from a JSON Lines file — resumable, budgeted, concurrent
(issue 16, docs/batch.md). This module is the batch itself.

Imported only by the ``dsh batch`` command (and by tests): ``dsh run`` never pays for it.

:func:`run_batch` reads and validates every task (:mod:`dsh.batch.tasks`), opens the journal
and the results file (:mod:`dsh.batch.journal`), picks the executor (:mod:`dsh.batch.executors`)
and runs a :class:`Batch` under :class:`~dsh.batch.progress.Signals`, its counts on a
:class:`~dsh.batch.progress.Progress` line. :class:`Batch` settles the attempts a dead process
left open, plans what is left, runs each task (retried while retries are left) under one shared
:class:`~dsh.host.runcontext.Budget` every task's run is chained to, and writes the result
lines (in input order with ``--ordered``).

The names this module held before it was split stay importable from it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.batch.executors import Executor
from dsh.batch.executors import LocalExecutor as LocalExecutor  # re-exported
from dsh.batch.executors import RemoteExecutor as RemoteExecutor  # re-exported
from dsh.batch.executors import Unit
from dsh.batch.executors import WorkerLost
from dsh.batch.executors import get_executor
from dsh.batch.executors import result_data as result_data  # re-exported
from dsh.batch.executors import result_from_data
from dsh.batch.executors import run_unit as run_unit  # re-exported
from dsh.batch.journal import Attempt
from dsh.batch.journal import Journal
from dsh.batch.journal import ResultsFile
from dsh.batch.journal import iter_lines as iter_lines  # re-exported
from dsh.batch.journal import journal_path
from dsh.batch.journal import result_from_ledger
from dsh.batch.progress import Progress
from dsh.batch.progress import Signals
from dsh.batch.tasks import TASK_KEYS as TASK_KEYS  # re-exported
from dsh.batch.tasks import Task
from dsh.batch.tasks import load_tasks
from dsh.batch.tasks import read_tasks
from dsh.batch.tasks import task_text as task_text  # re-exported
from dsh.core.errors import DshError
from dsh.core.errors import UsageError
from dsh.host.runcontext import Budget
from dsh.host.runcontext import CancelToken
from dsh.host.runcontext import Limits
from dsh.run.result import result_dict

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext
    from dsh.run.app import App
    from dsh.run.app import RunResult

#: Outcomes that are a task's answer, good or bad (a result line is written for them once no
#: retry is left). ``stopped``/``aborted`` by the batch itself, and ``budget`` from the
#: *batch's* limits, leave the task for the next run instead.
OK = "completed"


@attrs.frozen
class Outcome:
    """What one task's job returns to the driver."""

    task: Task
    attempt: int
    result: RunResult
    agent: str
    model: str
    #: ``final`` (write its result line), ``retry`` or ``left`` (stopped by the batch).
    kind: str


class Batch:
    """One ``dsh batch`` invocation (see :func:`run_batch` for the parameters)."""

    def __init__(self, app: App, tasks: list[Task], *, results: ResultsFile, journal: Journal,
                 executor: Executor, workers: int, agent: str | None,
                 overrides: dict[str, Any], limits: Limits | None,
                 task_limits: Limits | None, retries: int, ordered: bool,
                 approve: bool = False, stream: Any = None) -> None:
        self.app = app
        self.tasks = tasks
        self.results = results
        self.journal = journal
        self.executor = executor
        self.workers = workers
        self.agent_name = agent
        self.overrides = overrides
        self.task_limits = task_limits
        self.retries = retries
        self.ordered = ordered
        self.approve = approve
        #: A remote executor's (:class:`RemoteExecutor`): tasks are dispatched as units.
        self.dispatch: Callable[[Unit], dict[str, Any]] | None = getattr(
            executor, "dispatch", None)
        shared = getattr(executor, "shared_budget", None) if self.dispatch else None
        self.budget = shared(limits or Limits()) if shared else Budget(limits or Limits())
        self.cancel = CancelToken()
        self.stopping = ""  # why no more tasks start ("" while they do)
        self.interrupts = 0
        self._running: set[RunContext] = set()
        self._lock = threading.Lock()
        self._agents: dict[Any, Any] = {}
        self._pending: dict[int, Outcome | None] = {}  # --ordered: index → outcome
        self._next = 0
        self.stream = stream
        self.failed_before = 0  # tasks whose failure an earlier run wrote, not retried now

    # -- before any task starts ---------------------------------------------------------

    def overrides_for(self, task: Task) -> tuple[str | None, dict[str, Any]]:
        """The agent name and overrides of ``task``."""
        overrides = dict(self.overrides)
        if task.model:
            overrides["model"] = task.model
        if task.options:
            overrides["options"] = {**overrides.get("options", {}), **task.options}
        return task.agent or self.agent_name, overrides

    def agent_for(self, task: Task) -> Any:
        name, overrides = self.overrides_for(task)
        key = (name, repr(sorted(overrides.items())))
        agent = self._agents.get(key)
        if agent is None:
            agent = self.app.agent(name, **overrides)
            agent.model.provider_tools(agent.tool_specs)  # the adapter resolves, keys checked
            _ = agent.options
            self._agents[key] = agent
        return agent

    def check(self, where: str) -> None:
        """Every task's agent, model, options and session resolve (errors name the line)."""
        store = self.app.store
        for task in self.tasks:
            try:
                self.agent_for(task)
                if task.session and not store.exists(task.session):
                    raise UsageError(f"no session {task.session!r}")
            except DshError as exc:
                raise UsageError(f"{where}:{task.line}: {exc}") from None

    def plan(self) -> tuple[list[Task], int]:
        """The tasks this run starts, and how many are already done. Attempts a dead process
        left open are settled first: a session whose turn completed gets its result line
        from its ledger; any other is opened once, which closes it as interrupted (the task
        then runs again, in a new session — or in its own ``session`` again)."""
        todo: list[Task] = []
        skipped = 0
        retry_keys: set[str] = set()
        for task in self.tasks:
            tries = self.journal.attempts.get(task.key, [])
            line = self.results.done.get(task.key)
            if line is None and self.results.path is None:  # results went to a stdout
                line = next(({"outcome": a.outcome} for a in reversed(tries) if a.final), None)
            for n, attempt in enumerate(tries, 1):
                if attempt.outcome is None:
                    settled = self.settle(task, n, attempt, has_line=line is not None)
                    if settled is not None and line is None:
                        line = settled
            if line is not None:
                failed_tries = sum(1 for a in tries
                                   if a.outcome not in (None, OK, "left", "died"))
                if line.get("outcome") != OK and failed_tries <= self.retries:
                    retry_keys.add(task.key)  # a failed one with retries left (more now)
                    todo.append(task)
                else:
                    skipped += 1
                    self.failed_before += line.get("outcome") != OK
            else:
                todo.append(task)
        self.results.drop(retry_keys)
        return todo, skipped

    def settle(self, task: Task, n: int, attempt: Attempt, *,
               has_line: bool) -> dict[str, Any] | None:
        """Close attempt ``n`` that a dead process left open; return its result line when its
        turn had completed and no line was written yet (it is written now)."""
        store = self.app.store
        outcome = "died"
        line = None
        if store.exists(attempt.session):
            try:
                store.open(attempt.session).close()  # recovers: closes it as interrupted
                result = result_from_ledger(store, attempt.session, attempt.turn)
            except DshError:
                result = None
            if result is not None and result.outcome == OK:
                outcome = OK
                if not has_line:
                    agent = self.agent_for(task)
                    line = {"id": task.id, **result_dict(result, agent.name, agent.model_id)}
                    self.results.open()
                    self.results.write(line)
            elif result is not None and has_line:
                outcome = result.outcome  # its line was written; the journal was not
        self.journal.ended(task, n, outcome, final=outcome != "died")
        return line

    # -- running ------------------------------------------------------------------------

    def feed(self, todo: list[Task], progress: Progress) -> Iterator[Task]:
        for task in todo:
            if not self.stopping:
                reason = self.budget.exceeded()
                if reason:
                    self.stopping = f"batch budget: {reason}"
            if self.stopping:
                return
            progress.change(running=1)
            yield task

    def job(self, task: Task) -> Outcome:
        """Run ``task`` (retried here while retries are left). Never raises: a journal that
        cannot be written stops the batch, and the task is left for the next run."""
        from dsh.run.app import RunResult

        try:
            return self._job(task)
        except Exception as exc:
            from dsh.core.redact import redact

            reason = redact(f"{type(exc).__name__}: {exc}")
            self.stop(f"error: {reason}")
            agent = self.agent_for(task)
            return Outcome(task, 0, RunResult(output="", session_id="", outcome="error",
                                              reason=reason, error=exc),
                           agent.name, agent.model_id, "left")

    def _job(self, task: Task) -> Outcome:
        from dsh.run.app import RunResult
        from dsh.run.app import describe_error

        agent = self.agent_for(task)
        lost = 0
        while True:
            attempt = 0
            if self.dispatch is not None:
                attempt, result = self._remote(task, agent)
                if result.outcome == "died":
                    lost += 1
                    if self.stopping or lost <= self.max_lost:
                        self.journal.ended(task, attempt, "died")
                        if self.stopping:
                            return Outcome(task, 0, result, agent.name, agent.model_id, "left")
                        continue  # again, in a new session; a died attempt is no failure
                    # Once too often: the task's own failure (counted against --retries).
                    result = attrs.evolve(result, outcome="error", reason=(
                        f"the worker running it died {lost} times: {result.reason}"))
            else:
                try:
                    session = self.app.open_session(agent, task.session)
                except Exception as exc:
                    result = RunResult(output="", session_id="", outcome="error",
                                       reason=describe_error(self.app.pm, exc), error=exc)
                else:
                    with session:
                        attempt = self.journal.started(task, session.id,
                                                       session.ledger.projection.turn + 1)
                        result = session.send(task.text, limits=self.task_limits,
                                              budget_parent=self.budget,
                                              context_hook=self._attach, approve=self.approve)
            kind = self.classify(task, result)
            if kind == "retry" and self.stopping:
                kind = "left"
            if attempt and kind != "final":
                # A final outcome is journalled once its result line is written (emit): a
                # process killed in between leaves the attempt open, and the rerun settles
                # it from its ledger instead of running the task again.
                self.journal.ended(task, attempt, "left" if kind == "left" else result.outcome)
            if kind != "retry":
                return Outcome(task, attempt, result, agent.name, agent.model_id, kind)

    #: Deaths of a task's worker in one invocation before it counts as the task's error.
    max_lost = 2

    def _remote(self, task: Task, agent: Any) -> tuple[int, RunResult]:
        """One attempt of ``task`` through the remote executor: the session chosen and
        journalled here, the unit dispatched; a lost worker's ledger is closed as interrupted
        here (outcome ``died``)."""
        from dsh.ledger.store import new_session_id
        from dsh.run.app import RunResult
        from dsh.run.app import describe_error

        assert self.dispatch is not None
        store = self.app.store
        try:
            if task.session:
                with store.open(task.session) as ledger:  # its next turn, for the journal
                    sid, turn, create = task.session, ledger.projection.turn + 1, False
            else:
                sid, turn, create = new_session_id(), 1, True
        except Exception as exc:
            return 0, RunResult(output="", session_id="", outcome="error",
                                reason=describe_error(self.app.pm, exc), error=exc)
        attempt = self.journal.started(task, sid, turn)
        name, overrides = self.overrides_for(task)
        directory = getattr(store, "directory", None)
        unit = Unit(config=self.app.config, store=str(directory) if directory else None,
                    task=task, agent=name, overrides=overrides, limits=self.task_limits,
                    session=sid, create=create, approve=self.approve)
        try:
            result = result_from_data(self.dispatch(unit))
        except WorkerLost as exc:
            result = RunResult(output="", session_id=sid, outcome="died", reason=str(exc),
                               path=store.path(sid) if hasattr(store, "path") else None)
        except Exception as exc:
            result = RunResult(output="", session_id=sid, outcome="error",
                               reason=describe_error(self.app.pm, exc), error=exc)
        else:
            return attempt, result
        if store.exists(sid):
            try:
                store.open(sid).close()  # recovers: closes it as interrupted
            except DshError:
                pass
        return attempt, result

    def classify(self, task: Task, result: RunResult) -> str:
        if result.outcome == OK:
            return "final"
        if self.cancel.cancelled or result.outcome == "stopped":
            return "left"  # the batch stopped it (Ctrl-C, SIGTERM)
        if result.outcome == "budget" and "in a parent run" in result.reason:
            self.stopping = self.stopping or f"batch budget: {result.reason}"
            return "left"
        tries = self.journal.attempts.get(task.key, [])
        failed = sum(1 for a in tries if a.outcome not in (None, OK, "left", "died"))
        return "retry" if failed + 1 <= self.retries else "final"

    def _attach(self, ctx: RunContext) -> None:
        with self._lock:
            self._running.add(ctx)
            ctx.add_cleanup(lambda: self._detach(ctx))
            # Not send(cancel=self.cancel): a child CancelToken registers a callback on its
            # parent that stays for the parent's life, one per task (memory growing with N).
            if self.cancel.cancelled:
                ctx.abort(self.cancel.reason)
            elif self.stopping:
                ctx.stop()

    def _detach(self, ctx: RunContext) -> None:
        with self._lock:
            self._running.discard(ctx)

    def stop(self, reason: str) -> None:
        """Start no more tasks; running ones stop after their current step."""
        self.stopping = self.stopping or reason
        with self._lock:
            for ctx in list(self._running):
                ctx.stop()
        if self.dispatch is not None:
            self.executor.stop(reason, abort=False)  # type: ignore[attr-defined]

    def abort(self, reason: str) -> None:
        """Abort the running tasks now (in-flight model calls are closed)."""
        self.stop(reason)
        self.cancel.cancel(reason)
        with self._lock:
            for ctx in list(self._running):
                ctx.abort(reason)
        if self.dispatch is not None:
            self.executor.stop(reason, abort=True)  # type: ignore[attr-defined]

    def emit(self, out: Outcome) -> None:
        """Write ``out``'s result line (in input order with ``--ordered``), then journal
        the attempt's outcome."""
        final = out if out.kind == "final" else None
        if not self.ordered:
            if final is not None:
                self._write(final)
            return
        self._pending[out.task.index] = final
        self._flush_ordered()

    def _write(self, out: Outcome) -> None:
        self.results.write({"id": out.task.id,
                            **result_dict(out.result, out.agent, out.model)})
        if out.attempt:
            self.journal.ended(out.task, out.attempt, out.result.outcome, final=True)

    def _flush_ordered(self) -> None:
        while self._next in self._pending:
            out = self._pending.pop(self._next)
            if out is not None:
                self._write(out)
            self._next += 1

    def run(self, where: str) -> int:
        """Run what is left; return the exit code."""
        todo, skipped = self.plan()
        progress = Progress(len(self.tasks), skipped, self.budget, self.stream)
        if self.ordered:  # tasks not run now (done before) take no place in the order
            planned = {t.index for t in todo}
            self._pending.update({t.index: None for t in self.tasks if t.index not in planned})
            self._flush_ordered()
        self.results.open()
        try:
            for out in self.executor.run(self.job, self.feed(todo, progress),
                                         workers=self.workers):
                self.emit(out)
                ok = out.kind == "final" and out.result.outcome == OK
                failed = out.kind == "final" and not ok
                progress.change(running=-1, done=int(ok), failed=int(failed))
                if failed:
                    progress.note(f"task {out.task.id} (line {out.task.line}): "
                                  f"{out.result.outcome}: {out.result.reason}")
        finally:
            if self.ordered:  # tasks never started: keep the order of those that ended
                self._pending.update({i: None for i in range(len(self.tasks))
                                      if i not in self._pending and i >= self._next})
                self._flush_ordered()
            progress.stop()
            self.executor.close()
        left = progress.left  # tasks stopped by the batch count as left, not run
        elapsed = time.monotonic() - progress.started
        why = f" ({self.stopping})" if self.stopping and left else ""
        ok_before, failed_before = skipped - self.failed_before, self.failed_before
        progress.note(f"batch: {len(self.tasks)} tasks: {progress.done + ok_before} completed"
                      f"{f' ({ok_before} before)' if ok_before else ''}, "
                      f"{progress.failed + failed_before} failed"
                      f"{f' ({failed_before} before)' if failed_before else ''}, "
                      f"{left} left{why}; {progress.tokens()}; {elapsed:.1f}s")
        if self.interrupts:
            return 130
        if left and self.stopping.startswith("batch budget"):
            return 3
        return 1 if progress.failed or failed_before or left else 0


def run_batch(app: App, source: str, *, results: Path | None, workers: int,
              agent: str | None, overrides: dict[str, Any], limits: Limits | None,
              task_limits: Limits | None, retries: int, executor: str, ordered: bool,
              approve: bool = False, out: Any = None, err: Any = None) -> int:
    """``dsh batch``: validate every task, then run what is left; return the exit code.

    :param overrides: agent overrides for every task (``-m``, ``-o``), a task's own
        ``model``/``options`` on top.
    :param limits: the whole batch's limits (one :class:`Budget` every task is chained to).
    :param task_limits: each task's own limits.
    """
    raw, where = read_tasks(source)
    tasks = load_tasks(raw, where)
    chosen = get_executor(app, executor)
    journal = Journal(journal_path(app, results, raw))
    try:
        sink = ResultsFile(results, out)
        batch = Batch(app, tasks, results=sink, journal=journal, executor=chosen,
                      workers=workers, agent=agent, overrides=overrides, limits=limits,
                      task_limits=task_limits, retries=retries, ordered=ordered,
                      approve=approve, stream=err)
        batch.check(where)
        note = Progress(0, 0, batch.budget, err).note
        with Signals(batch, note):
            try:
                return batch.run(where)
            finally:
                sink.close()
    finally:
        journal.close()
