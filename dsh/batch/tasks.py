"""The tasks of a batch: one JSON object a line, each validated before any task starts.

:func:`read_tasks` reads the tasks file (or stdin), :func:`load_tasks` turns its lines into
:class:`Task` objects — the first bad line a :class:`~dsh.core.errors.UsageError` naming
``FILE:LINE`` — and :func:`task_text` builds a task's user message as ``dsh run`` builds it from
an argument and stdin.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs

from dsh.core.errors import UsageError

#: Keys a task line may have.
TASK_KEYS = ("id", "prompt", "input", "agent", "model", "options", "session")


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
