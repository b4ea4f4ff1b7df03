"""The lines ``dsh run`` leaves on a terminal while it works (docs/cli.md, "What a run shows
on a terminal"): :class:`WorkLog` — each tool call with its arguments in short form
(``→ run_command git status``) and its end (``← ok 22 ms``), approvals, permission-mode
changes, retries of a model request, compactions (``compacting the history…`` when one
starts, the tokens saved when it is recorded), and the same of the run's sub-agents, indented
and named.

Only when stderr is a terminal (``RunOutput`` builds it then, unless ``-q``), and written
through the status line (:meth:`dsh.cli.status.StatusLine.note`: the status is erased, the
line written, the status redrawn), so the spinner never overwrites one. What a model, a tool
or a server wrote has its controls made visible and known secrets redacted before it is shown.

Imports click, :mod:`dsh.cli.escape` and :mod:`dsh.core.redact`; built only on a terminal.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any

import click

from dsh.cli.escape import escape_controls
from dsh.cli.escape import one_line

#: The argument a tool's call is shown by (``→ read_file src/app.py``); other tools show
#: their arguments as compact JSON.
SHORT_FORM = {
    "run_command": "command", "read_file": "path", "write_file": "path", "edit_file": "path",
    "multi_edit": "path", "list_dir": "path", "glob": "pattern",
}
#: Approvals nobody needs to hear about: the mode allowed it, ``--yes`` did (said once at the
#: start), or the call was the program's own.
_QUIET_APPROVALS = frozenset({"mode", "yes", "caller"})


def shown(text: str, width: int) -> str:
    """``text`` from a model, a tool or a server, fit for one terminal line: secrets of known
    shapes redacted, controls made visible, cut to ``width``."""
    from dsh.core.redact import redact

    return one_line(escape_controls(redact(text), newlines=False), max(width, 10))


def arguments_text(name: str, arguments: Any) -> str:
    """A call's arguments in short form: the one that names what it acts on (a command, a
    path), else compact JSON."""
    key = SHORT_FORM.get(name)
    if key is not None and isinstance(arguments, Mapping):
        value = arguments.get(key)
        if isinstance(value, str) and value:
            return value
    try:
        return json.dumps(dict(arguments), ensure_ascii=False, separators=(",", ":"),
                          default=str)
    except (TypeError, ValueError):
        return str(arguments)


def duration(ms: float | None) -> str:
    if ms is None:
        return ""
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


def result_text(name: str, status: str, output: str, ms: float | None) -> str:
    """``ok 22 ms``, ``exit code 1 · 40 ms`` (a command that failed), ``error <first line>``,
    or the status (``budget``, ``interrupted``) with the output's first line."""
    took = duration(ms)
    head = first_line(output)
    if status == "ok":
        if name == "run_command" and (head.startswith("exit code: ") and head != "exit code: 0"
                                      or head.startswith("killed by signal")):
            return head.replace("exit code: ", "exit code ") + (f" · {took}" if took else "")
        return f"ok {took}".rstrip()
    return f"{status} {head}".rstrip()


def retry_text(data: Any) -> str:
    """``retrying after HTTP 500 (2/4) in 1.3 s``; a 429: ``rate limited by openai: waiting
    2.0 s (1/4)``; a connection failure names itself."""
    attempt = f"({data.get('attempt')}/{data.get('retries')})"
    wait = float(data.get("wait") or 0)
    status = data.get("status")
    if status == 429:
        return f"rate limited by {data.get('provider')}: waiting {wait:.1f} s {attempt}"
    if status:
        why = f"HTTP {status}"
    else:
        error = str(data.get("error") or "a failure")
        provider = f"{data.get('provider')}: "
        why = error[len(provider):] if error.startswith(provider) else error
        why = one_line(why.split(" — ")[0], 60)  # what failed, not the advice after it
    return f"retrying after {why} {attempt} in {wait:.1f} s"


class WorkLog:
    """Lines of the run's work on stderr, fed from ``Session.send(on_event=...)``, written
    with ``note`` (the status line's, which erases and redraws it). ``tools``: show tool
    calls and results (``dsh chat`` shows its own); ``ctx``: the running turn's context, for
    its permission mode.

    At the turn's start it watches the run's sub-agents
    (:func:`dsh.run.subagent.watch_subagents`): their tool calls, results, approvals, retries
    and compactions are shown indented under the ``ask_CHILD`` call, named by the sub-agent
    (``  researcher: → read_file notes.md``). Sub-agents running side by side deliver their
    events from their own threads: a lock keeps one event at a time."""

    def __init__(self, note: Callable[[str], None], *, color: bool = False,
                 ctx: Callable[[], Any] = lambda: None) -> None:
        import threading

        self.note = note
        self.color = color
        self.ctx = ctx
        self.tools = True
        #: The top-level session (events of another session are a sub-agent's).
        self.session = ""
        self.mode = ""
        self._agents: dict[str, tuple[str, int]] = {}  # a sub-agent's session: name, depth
        self._pending: dict[str, dict[str, str]] = {}  # per session: call id → tool
        self._several: set[str] = set()  # sessions whose calls run side by side: results
        self._watched: Any = None  # the run whose sub-agents are watched
        self._lock = threading.RLock()
        self._held: list[str] = []  # lines that came while a question was on the terminal

    @staticmethod
    def width() -> int:
        return shutil.get_terminal_size((80, 24)).columns - 1

    def write(self, text: str, *, dim: bool = False, prefix: str = "") -> None:
        """``text``, already made safe, on its own line. While someone is asked something on
        the terminal (:func:`dsh.cli.status.asking`: a sub-agent's approval question while
        another one works), lines are held, and written once the question is answered: a
        line never lands inside a question or its answer."""
        from dsh.cli.status import asking

        line = prefix + text
        line = click.style(line, dim=True) if self.color and dim else line
        with self._lock:
            if asking():
                self._held.append(line)
                return
            self.flush()
            self.note(line)

    def flush(self) -> None:
        """Write the lines held while a question was asked (the run's end calls it too)."""
        with self._lock:
            held, self._held = self._held, []
            for line in held:
                self.note(line)

    def _prefix(self, event: Any) -> str:
        """A sub-agent's lines are indented (two spaces a level) and name it."""
        session = getattr(event, "session", "")
        if not session or not self.session or session == self.session:
            return ""
        name, depth = self._agents.get(session, ("sub-agent", 1))
        return "  " * depth + escape_controls(name, newlines=False) + ": "

    def on_subagent(self, event: Any, agent: str, depth: int) -> None:
        """An event of a sub-agent's run (``watch_subagents``), from the sub-agent's thread."""
        with self._lock:
            session = getattr(event, "session", "")
            if session and session != self.session:
                self._agents[session] = (agent or "sub-agent", max(depth, 1))
            self.on_event(event)

    def _watch(self) -> None:
        """Watch the sub-agents of the running turn (once per run)."""
        ctx = self.ctx()
        if ctx is None or ctx is self._watched:
            return
        from dsh.run.subagent import watch_subagents

        self._watched = ctx
        watch_subagents(ctx, self.on_subagent)

    def on_event(self, event: Any) -> None:
        with self._lock:
            self._on_event(event)

    def _on_event(self, event: Any) -> None:
        kind = getattr(event, "type", "")
        if kind == "turn/start":
            session = getattr(event, "session", "")
            if session != self.session and self.session:
                if getattr(event, "parent", None) and session not in self._agents:
                    self._agents[session] = (getattr(event, "agent", "") or "sub-agent", 1)
                return
            self._watch()
            if getattr(event, "mode", None) and not self.mode:
                self.mode = event.mode
        elif kind == "tool/call" and self.tools:
            prefix = self._prefix(event)
            session = getattr(event, "session", "")
            pending = self._pending.setdefault(session, {})
            if pending:
                self._several.add(session)
            pending[event.call_id] = event.name
            head = f"→ {event.name} "
            width = self.width() - len(prefix) - len(head)
            self.write(escape_controls(head, newlines=False)
                       + shown(arguments_text(event.name, event.arguments), width),
                       prefix=prefix)
        elif kind == "tool/result":
            if self.tools:
                self._result(event)
            self._mode_changed(event)
        elif kind == "step/start":
            self._mode_changed(event)
        elif kind == "x" and getattr(event, "plugin", "") == "dsh.tools" and getattr(
                event, "name", "") == "approval":
            self._approval(event)
        elif kind == "llm/retry":
            self.write("dsh: " + shown(retry_text(event.data), self.width() - 5),
                       prefix=self._prefix(event))
        elif kind == "context/compacting":  # a summary may take a while
            data = getattr(event, "data", {})
            self.write("dsh: compacting the history ("
                       + shown(f"{data.get('strategy') or 'compaction'}, "
                               f"{data.get('tokens')} tokens", 60) + ")…",
                       dim=True, prefix=self._prefix(event))
        elif kind == "context/compacted":
            self.write(f"dsh: compacted the history: {event.tokens_before} → "
                       f"{event.tokens_after} tokens ("
                       + shown(f"{event.strategy or 'compaction'}, {event.reason}", 60) + ")",
                       dim=True, prefix=self._prefix(event))

    def _result(self, event: Any) -> None:
        prefix = self._prefix(event)
        session = getattr(event, "session", "")
        several = session in self._several
        name = escape_controls(event.name, newlines=False) + " " if several else ""
        pending = self._pending.get(session, {})
        pending.pop(event.call_id, None)
        if not pending:
            self._several.discard(session)
        text = result_text(event.name, event.status, event.output, event.duration_ms)
        self.write(f"← {name}" + shown(text, self.width() - len(prefix) - len(name) - 2),
                   dim=event.status == "ok", prefix=prefix)

    def _approval(self, event: Any) -> None:
        data = event.data
        if data.get("allowed") and data.get("by") in _QUIET_APPROVALS:
            return
        verdict = "approved" if data.get("allowed") else "refused"
        text = f"{data.get('tool')} {verdict}: {data.get('why')}"
        self.write("dsh: " + shown(text, self.width() - 5), prefix=self._prefix(event))

    def _mode_changed(self, event: Any) -> None:
        if self._prefix(event):
            return  # a sub-agent's mode is the narrower of its own and its parent's
        ctx = self.ctx()
        mode = getattr(ctx, "mode", "") if ctx is not None else ""
        if not mode:
            return
        if self.mode and mode != self.mode:
            self.write(f"dsh: permission mode: {escape_controls(self.mode, newlines=False)} "
                       f"→ {escape_controls(mode, newlines=False)}")
        self.mode = mode
