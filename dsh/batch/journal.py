"""What a batch keeps on disk: the journal, the results file, and recovery from them.

:class:`Journal` is the batch's own record (task id → attempts: session, turn, outcome),
append-only JSON Lines next to the results, locked while a batch runs; :class:`ResultsFile`
holds one result line per finished task. Both are read back with a torn last line cut, so a
rerun of the same command skips what is done, retries what failed and re-runs what a dead
process left; :func:`result_from_ledger` rebuilds the result of a turn whose line a killed
batch never wrote.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import UsageError
from dsh.run.result import compact_json as _compact

if TYPE_CHECKING:
    from dsh.batch.tasks import Task
    from dsh.run.app import App
    from dsh.run.app import RunResult

#: A results or journal line nested deeper than this is damaged (dsh writes flat lines; a
#: structured answer is bounded by the schema depth well below it).
MAX_LINE_DEPTH = 128


def _read_lines(path: Path, what: str = "results") -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSON Lines file we write, and the length of its complete lines
    (a torn last line — no newline, left by a process killed mid-write — is not in it, and is
    all that is ever cut). A complete line that is not a JSON object (edited, damaged, nested
    too deeply) is a :class:`UsageError` naming the file and line: a good line after it is
    never deleted."""
    from dsh.core import files
    from dsh.core.sanitize import nesting_depth

    try:
        data = files.read_regular(path)
    except FileNotFoundError:
        return [], 0
    except files.NotRegular as exc:
        raise UsageError(f"{path}: the batch {what} file is {exc.kind}, not a regular "
                         "file") from None
    except OSError as exc:
        raise UsageError(f"cannot read the batch {what} file {path}: "
                         f"{files.reason(exc)}") from None
    out: list[dict[str, Any]] = []
    good = number = 0
    while (nl := data.find(b"\n", good)) >= 0:
        number += 1
        line, good = data[good:nl], nl + 1
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            problem = ("not a JSON object" if not isinstance(item, dict) else
                       f"nested more than {MAX_LINE_DEPTH} levels deep"
                       if nesting_depth(item, MAX_LINE_DEPTH) > MAX_LINE_DEPTH else "")
        except RecursionError:
            problem = "nested too deeply to read"
        except ValueError as exc:
            problem = f"not valid JSON ({exc})"
        if not problem and what == "journal":
            problem = _journal_problem(item)
        if problem:
            raise UsageError(f"{path}:{number}: the batch {what} line is damaged: {problem}; "
                             "dsh never deletes a complete line: fix or remove it, then run "
                             "the batch again")
        out.append(item)
    return out, good


def _journal_problem(item: dict[str, Any]) -> str:
    """What is wrong with a journal line's fields, or ``""``."""
    task, attempt = item.get("task"), item.get("attempt")
    if isinstance(task, bool) or not isinstance(task, str | int):
        return "'task' must be a task id (a string or an integer)"
    if type(attempt) is not int or attempt < 1:
        return "'attempt' must be an integer ≥ 1"
    if "session" in item:
        if not isinstance(item["session"], str) or not item["session"]:
            return "'session' must be a session id"
        turn = item.get("turn", 1)
        if type(turn) is not int or turn < 1:
            return "'turn' must be an integer ≥ 1"
        return ""
    if item.get("outcome") is not None and not isinstance(item["outcome"], str):
        return "'outcome' must be a string"
    if not isinstance(item.get("final", False), bool):
        return "'final' must be true or false"
    return ""


def _open_locked(path: Path, what: str) -> int:
    """``path`` opened (created ``0600``) and locked for this batch alone. The lock is on the
    file itself (``flock``: its inode), so the same file under another name — a symbolic
    link, a hard link, ``./x`` — is refused as well; a FIFO or a device is refused unread."""
    import stat

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            from dsh.core.files import kind_of

            raise UsageError(f"{path}: the batch {what} file is {kind_of(mode)}, not a "
                             "regular file")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        real = os.path.realpath(path)
        same = f" (it is {real})" if real != os.path.abspath(path) else ""
        raise UsageError(f"another dsh batch is using {path}{same}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _append(fd: int, good: int) -> Any:
    """The locked ``fd`` for appending, cut back to its ``good`` prefix first."""
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
        fd = _open_locked(path, "journal")  # locked before it is read or cut
        try:
            lines, good = _read_lines(path, "journal")
        except BaseException:
            os.close(fd)
            raise
        self.attempts: dict[str, list[Attempt]] = {}
        for item in lines:
            task, n = str(item.get("task")), item.get("attempt")
            tries = self.attempts.setdefault(task, [])
            if "session" in item:
                tries.append(Attempt(item["session"], item.get("turn", 1)))
            elif isinstance(n, int) and 0 < n <= len(tries):
                tries[n - 1].outcome = item.get("outcome")
                tries[n - 1].final = bool(item.get("final"))
        self._file = _append(fd, good)
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
            self._fd = -1
            return
        self._fd = _open_locked(path, "results")  # a second batch on this file is refused
        try:
            lines, self._good = _read_lines(path)
        except BaseException:
            os.close(self._fd)
            raise
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
        real = Path(os.path.realpath(self.path))  # a symbolic link stays one
        tmp = real.with_name(real.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for item in lines:
                if str(item.get("id")) not in keys:
                    f.write(_compact(item) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, real)
        fd = _open_locked(real, "results")  # the new file: locked before the old is let go
        was_open = self._file is not None
        if self._file is not None:
            self._file.close()
            self._file = None
        else:
            os.close(self._fd)
        self._fd = fd
        for key in keys:
            self.done.pop(key, None)
        self._good = os.fstat(fd).st_size
        if was_open:
            self._file = _append(fd, self._good)

    def open(self) -> None:
        if self.path is not None and self._file is None:
            self._file = _append(self._fd, self._good)

    def write(self, data: dict[str, Any]) -> None:
        with self._lock:
            assert self._file is not None
            self._file.write(_compact(data) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self.path is None:
            return
        if self._file is not None:
            self._file.close()  # closes the locked descriptor too
        elif self._fd >= 0:
            os.close(self._fd)
        self._fd = -1


def journal_path(app: App, results: Path | None, raw: bytes) -> Path:
    """``RESULTS.journal`` beside the results; with results on stdout, a file named by the
    tasks' content hash under ``batches/`` beside the sessions directory."""
    if results is not None:  # by the real name: a link to the results shares their journal
        real = Path(os.path.realpath(results))
        return real.with_name(real.name + ".journal")
    from dsh.ledger.store import default_data_dir

    sessions = Path(getattr(app.store, "directory", default_data_dir() / "sessions"))
    return sessions.parent / "batches" / f"{hashlib.sha256(raw).hexdigest()[:24]}.journal"


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


def iter_lines(path: Path) -> Iterable[dict[str, Any]]:
    """The result lines of a results file (for scripts and tests)."""
    return _read_lines(path)[0]
