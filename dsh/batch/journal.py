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
