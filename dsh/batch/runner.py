"""``dsh batch``: many agent runs from a JSON Lines file — resumable, budgeted, concurrent
(issue 16, docs/batch.md).

Imported only by the ``dsh batch`` command (and by tests): ``dsh run`` never pays for it.

Pieces, in the order a batch uses them:

* :func:`load_tasks` reads and validates every line before any task starts;
* :class:`Journal` is the batch's own record (task id → attempts: session, turn, outcome),
  append-only JSON Lines next to the results; with :class:`ResultsFile` it makes a rerun of
  the same command skip what is done, retry what failed and re-run what a dead process left;
* :class:`Batch` runs the tasks through an executor (``batch_executor`` hook;
  :class:`LocalExecutor` is the built-in one: threads), under one shared
  :class:`~dsh.host.runcontext.Budget` every task's run is chained to;
* :class:`Progress` draws the progress line on a terminal's stderr and the final summary.
"""

from __future__ import annotations

import contextvars
import fcntl
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
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

from dsh.core.errors import DshError
from dsh.core.errors import UsageError
from dsh.host.runcontext import Budget
from dsh.host.runcontext import CancelToken
from dsh.host.runcontext import Limits
from dsh.run.result import compact_json as _compact
from dsh.run.result import result_dict

if TYPE_CHECKING:
    from dsh.config.loader import Config
    from dsh.host.runcontext import RunContext
    from dsh.run.app import App
    from dsh.run.app import RunResult

#: Keys a task line may have.
TASK_KEYS = ("id", "prompt", "input", "agent", "model", "options", "session")
#: Outcomes that are a task's answer, good or bad (a result line is written for them once no
#: retry is left). ``stopped``/``aborted`` by the batch itself, and ``budget`` from the
#: *batch's* limits, leave the task for the next run instead.
OK = "completed"


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------


@attrs.frozen
class Task:
    """One line of the tasks file (``line`` is its 1-based number, ``index`` its position)."""

    id: str | int
    line: int
    index: int
    text: str
    agent: str | None = None
    model: str | None = None
    options: dict[str, Any] | None = attrs.field(default=None, hash=False)
    session: str | None = None

    @property
    def key(self) -> str:
        """The id as the journal keys it (``1`` and ``"1"`` are the same task)."""
        return str(self.id)


def task_text(prompt: str | None, data: str | None) -> str:
    """The user message, built as ``dsh run`` builds it from an argument and stdin
    (:func:`dsh.cli.run_command.read_prompt`): ``input`` becomes a ``<stdin>`` block after the
    prompt."""
    data = (data.rstrip("\n") if data.strip() else "") if data else ""
    if prompt and data:
        return f"{prompt}\n\n<stdin>\n{data}\n</stdin>"
    return prompt or data


def load_tasks(raw: bytes, where: str) -> list[Task]:
    """Every task of a tasks file, validated; the first bad line is a :class:`UsageError`
    naming ``where:LINE``. Blank lines are skipped."""
    from dsh.config.loader import options_error

    tasks: list[Task] = []
    seen: dict[str, int] = {}
    sessions: dict[str, int] = {}
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line.strip():
            continue
        at = f"{where}:{number}"
        try:
            data = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            raise UsageError(f"{at}: not UTF-8") from None
        except (ValueError, RecursionError) as exc:
            raise UsageError(f"{at}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise UsageError(f"{at}: expected a JSON object, got {type(data).__name__}")
        extra = sorted(set(data) - set(TASK_KEYS))
        if extra:
            raise UsageError(f"{at}: unknown key {extra[0]!r} (known: {', '.join(TASK_KEYS)})")
        tid = data.get("id")
        if isinstance(tid, bool) or not isinstance(tid, (str, int)) or tid == "":
            raise UsageError(f"{at}: 'id' is required: a non-empty string or an integer")
        if str(tid) in seen:
            raise UsageError(f"{at}: duplicate id {tid!r} (first on line {seen[str(tid)]})")
        seen[str(tid)] = number
        for key in ("prompt", "input", "agent", "model", "session"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise UsageError(f"{at}: {key!r} must be a string")
        options = data.get("options")
        if options is not None:
            if not isinstance(options, dict):
                raise UsageError(f"{at}: 'options' must be an object")
            for k, v in options.items():
                problem = options_error(v, k)
                if problem:
                    raise UsageError(f"{at}: options: {problem}")
        text = task_text(data.get("prompt"), data.get("input"))
        if not text:
            raise UsageError(f"{at}: no prompt: give 'prompt' or 'input'")
        session = data.get("session")
        if session:
            if session in sessions:
                raise UsageError(f"{at}: session {session!r} is continued by line "
                                 f"{sessions[session]} too (one task per session)")
            sessions[session] = number
        tasks.append(Task(id=tid, line=number, index=len(tasks), text=text,
                          agent=data.get("agent"), model=data.get("model"),
                          options=options or None, session=session or None))
    return tasks


# --------------------------------------------------------------------------------------------
# The journal and the results file
# --------------------------------------------------------------------------------------------


def _read_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSON Lines file we write, and the length of its good prefix
    (a torn last line, left by a killed process, is not in it)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    out: list[dict[str, Any]] = []
    good = 0
    for line in data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n"):
        end = good + len(line) + 1
        if end > len(data):  # no newline: a torn last line
            break
        try:
            item = json.loads(line)
        except ValueError:
            break
        if isinstance(item, dict):
            out.append(item)
        good = end
    return out, good


def _open_append(path: Path, good: int) -> Any:
    """``path`` for appending, cut back to its ``good`` prefix first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    if os.fstat(fd).st_size > good:
        os.ftruncate(fd, good)
    os.lseek(fd, 0, os.SEEK_END)
    return os.fdopen(fd, "a", encoding="utf-8")


@attrs.define
class Attempt:
    session: str
    turn: int
    outcome: str | None = None
    #: Its result line was written (the task's answer).
    final: bool = False


class Journal:
    """The batch's record: ``{"task", "attempt", "session", "turn"}`` when an attempt starts
    (its session is open), ``{"task", "attempt", "outcome"}`` when it ends. Locked while a
    batch runs (a second ``dsh batch`` on the same record is refused)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lines, good = _read_lines(path)
        self.attempts: dict[str, list[Attempt]] = {}
        for item in lines:
            task, n = str(item.get("task")), item.get("attempt")
            tries = self.attempts.setdefault(task, [])
            if "session" in item:
                tries.append(Attempt(str(item["session"]), int(item.get("turn") or 1)))
            elif isinstance(n, int) and 0 < n <= len(tries):
                tries[n - 1].outcome = item.get("outcome")
                tries[n - 1].final = bool(item.get("final"))
        self._file = _open_append(path, good)
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise UsageError(f"another dsh batch is using {path}") from None
        self._lock = threading.Lock()

    def _write(self, item: dict[str, Any]) -> None:
        with self._lock:
            self._file.write(_compact(item) + "\n")
            self._file.flush()

    def started(self, task: Task, session: str, turn: int) -> int:
        tries = self.attempts.setdefault(task.key, [])
        tries.append(Attempt(session, turn))
        self._write({"task": task.id, "attempt": len(tries), "session": session, "turn": turn})
        return len(tries)

    def ended(self, task: Task, attempt: int, outcome: str, *, final: bool = False) -> None:
        """Attempt ``attempt`` ended; ``final``: its result line is written."""
        tried = self.attempts[task.key][attempt - 1]
        tried.outcome, tried.final = outcome, final
        self._write({"task": task.id, "attempt": attempt, "outcome": outcome,
                     **({"final": True} if final else {})})

    def close(self) -> None:
        self._file.close()


class ResultsFile:
    """Where result lines go: a file (appended, a torn last line cut; lines of tasks to run
    again dropped first) or stdout. One line per task, written and flushed as it is final."""

    def __init__(self, path: Path | None, out: Any = None) -> None:
        self.path = path
        self.done: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if path is None:
            self._file = out if out is not None else sys.stdout
            self._good = 0
            return
        lines, self._good = _read_lines(path)
        for item in lines:
            if "id" in item:
                self.done[str(item["id"])] = item
        self._file = None

    def drop(self, keys: set[str]) -> None:
        """Forget the lines of ``keys`` (tasks about to be retried): the file is rewritten
        without them (a temporary file renamed over it, so a crash keeps one or the other)."""
        if self.path is None or not keys:
            return
        lines, _ = _read_lines(self.path)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for item in lines:
                if str(item.get("id")) not in keys:
                    f.write(_compact(item) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        for key in keys:
            self.done.pop(key, None)
        self._good = self.path.stat().st_size

    def open(self) -> None:
        if self.path is not None and self._file is None:
            self._file = _open_append(self.path, self._good)

    def write(self, data: dict[str, Any]) -> None:
        with self._lock:
            assert self._file is not None
            self._file.write(_compact(data) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self.path is not None and self._file is not None:
            self._file.close()


def journal_path(app: App, results: Path | None, raw: bytes) -> Path:
    """``RESULTS.journal`` beside the results; with results on stdout, a file named by the
    tasks' content hash under ``batches/`` beside the sessions directory."""
    if results is not None:
        return results.with_name(results.name + ".journal")
    from dsh.ledger.store import default_data_dir

    sessions = Path(getattr(app.store, "directory", default_data_dir() / "sessions"))
    return sessions.parent / "batches" / f"{hashlib.sha256(raw).hexdigest()[:24]}.journal"


# --------------------------------------------------------------------------------------------
# Executors
# --------------------------------------------------------------------------------------------


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
            "context": result.context, "value": result.value}


def result_from_data(data: dict[str, Any]) -> RunResult:
    """The :class:`~dsh.run.app.RunResult` :func:`result_data` made ``data`` of."""
    from dsh.core.messages import Usage
    from dsh.run.app import RunResult

    return RunResult(output=data["output"], session_id=data["session_id"],
                     outcome=data["outcome"], reason=data["reason"], steps=data["steps"],
                     usage=Usage(**data["usage"]),
                     path=Path(data["path"]) if data["path"] else None,
                     context=data["context"], value=data["value"])


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


# --------------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------------


class Progress:
    """Counts, the progress line (stderr on a terminal only) and the summary line."""

    def __init__(self, total: int, skipped: int, budget: Budget, stream: Any = None) -> None:
        self.total = total
        self.skipped = skipped
        self.done = 0
        self.failed = 0
        self.running = 0
        self.budget = budget
        self.started = time.monotonic()
        self.stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            tty = False
        if tty:
            self._thread = threading.Thread(target=self._draw_loop, daemon=True,
                                            name="dsh-batch-progress")
            self._thread.start()

    def change(self, *, running: int = 0, done: int = 0, failed: int = 0) -> None:
        with self._lock:
            self.running += running
            self.done += done
            self.failed += failed

    @property
    def left(self) -> int:
        return self.total - self.skipped - self.done - self.failed - self.running

    def tokens(self) -> str:
        b = self.budget
        text = f"{b.input_tokens + b.output_tokens:,} tokens"
        return text + (f", cost {b.cost:.4f}" if b.cost else "")

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        finished = self.done + self.failed
        rate = finished / elapsed
        eta = f"ETA {(self.left + self.running) / rate:.0f}s" if rate > 0 else "ETA -"
        return (f"batch: {self.done + self.skipped}/{self.total} done · {self.failed} failed · "
                f"{self.running} running · {self.left} left · {rate:.1f}/s · {eta} · "
                f"{self.tokens()}")

    def _draw_loop(self) -> None:
        while not self._stop.wait(0.25):
            self._draw()

    def _draw(self) -> None:
        try:
            self.stream.write("\r\x1b[2K" + self.line())
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def note(self, message: str) -> None:
        try:
            clear = "\r\x1b[2K" if self._thread is not None else ""
            self.stream.write(f"{clear}dsh: {message}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            try:
                self.stream.write("\r\x1b[2K")
            except (OSError, ValueError):
                pass
            self._thread = None


# --------------------------------------------------------------------------------------------
# The batch
# --------------------------------------------------------------------------------------------


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


def result_from_ledger(store: Any, session: str, turn: int) -> RunResult | None:
    """The result of ``turn`` of ``session`` rebuilt from its ledger (a batch killed after the
    turn ended but before its result line), or None when the turn has no end."""
    from dsh.core.messages import Usage
    from dsh.ledger.events import AssistantMessage
    from dsh.ledger.events import StepEnded
    from dsh.ledger.events import TurnEnded
    from dsh.ledger.events import TurnStarted
    from dsh.run.app import RunResult

    current = 0
    output, steps, tin, tout = "", 0, 0, 0
    for event in store.read(session):
        if isinstance(event, TurnStarted):
            current = event.turn
        if current != turn:
            continue
        if isinstance(event, AssistantMessage):
            output = event.text or output
            tin += event.usage.input_tokens
            tout += event.usage.output_tokens
        elif isinstance(event, StepEnded):
            steps += 1
        elif isinstance(event, TurnEnded):
            return RunResult(output=output, session_id=session, outcome=event.outcome,
                             reason=event.reason, steps=steps, path=store.path(session),
                             usage=Usage(input_tokens=tin, output_tokens=tout))
    return None


class Signals:
    """SIGINT once: stop starting tasks, running ones stop after their step; twice (or
    SIGTERM/SIGHUP): abort the running ones. The process ends at once if they do not end
    within :attr:`grace` seconds of the abort."""

    grace = 10.0

    def __init__(self, batch: Batch, note: Callable[[str], None]) -> None:
        self.batch = batch
        self.note = note
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self._old[signal.SIGINT] = signal.signal(signal.SIGINT, self._int)
            for signum in (signal.SIGTERM, signal.SIGHUP):
                self._old[signum] = signal.signal(signum, self._term)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, old in self._old.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)

    def _int(self, signum: int, frame: Any) -> None:
        self.batch.interrupts += 1
        if self.batch.interrupts == 1:
            self.batch.stop("interrupted")
            self.note("stopping: no new tasks, running ones end after their step "
                      "(Ctrl-C again to abort)")
        else:
            self._abort("interrupted")

    def _term(self, signum: int, frame: Any) -> None:
        self.batch.interrupts += 1
        self._abort(f"terminated by {signal.Signals(signum).name}")

    def _abort(self, reason: str) -> None:
        if self.batch.cancel.cancelled:
            return
        self.batch.abort(reason)
        timer = threading.Timer(self.grace, os._exit, (130,))
        timer.daemon = True
        timer.start()


def read_tasks(source: str) -> tuple[bytes, str]:
    """The tasks file's bytes (``-``: stdin) and the name errors give it."""
    if source == "-":
        stdin = sys.stdin
        buf = getattr(stdin, "buffer", None)
        return (buf.read() if buf is not None else stdin.read().encode()), "<stdin>"
    try:
        return Path(source).read_bytes(), source
    except OSError as exc:
        from dsh.core.files import reason as os_reason

        raise UsageError(f"cannot read tasks file {source}: {os_reason(exc)}") from None


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


def iter_lines(path: Path) -> Iterable[dict[str, Any]]:
    """The result lines of a results file (for scripts and tests)."""
    return _read_lines(path)[0]
