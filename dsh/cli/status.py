"""The status line ``dsh run`` shows on stderr while it waits on the model or a tool
(:class:`StatusLine`: spinner, step, activity, elapsed time), and the way a plugin keeps it off
the terminal while it asks the user something (:func:`status_paused`, :func:`asking`).

Imports only click and :mod:`dsh.cli.escape`: what the line shows from a model or a tool has
its controls made visible.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO
from typing import Any

import click

from dsh.cli.escape import escape_controls
from dsh.cli.escape import one_line

_pauses = 0
_pause_lock = threading.Lock()
_status_lines: weakref.WeakSet[StatusLine] = weakref.WeakSet()


@contextmanager
def status_paused() -> Iterator[None]:
    """Erase every status line of this process and keep it off the terminal inside the
    block: for a plugin that asks the user something on the terminal (dsh-shell's approval
    question), which the status line would otherwise redraw over within 0.1 s."""
    global _pauses
    with _pause_lock:
        _pauses += 1
        lines = list(_status_lines)
    for line in lines:
        line.pause()
    try:
        yield
    finally:
        with _pause_lock:
            _pauses -= 1


def asking() -> bool:
    """True while some plugin asks the user something on the terminal
    (:func:`status_paused`): ``dsh chat`` stops reading typed lines meanwhile."""
    return _pauses > 0


class StatusLine:
    """One line on stderr (spinner, step, activity, elapsed time) while the run waits on the
    model or a tool; redrawn by a ticking thread, erased with ``\\r\\x1b[K``.

    Fed from ``Session.send(on_event=...)``; :meth:`hide` is called before text is written to
    the same terminal. Thread-safe: events arrive from tool worker threads too.
    """

    FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"

    def __init__(self, stream: IO[str], *, color: bool = False, interval: float = 0.1) -> None:
        self.stream = stream
        self.color = color
        self.interval = interval
        self.step = 0
        self.activity = "starting"
        #: ``dsh.tasks``' progress once the run updates the task list (issue 25).
        self.tasks = ""
        #: The run's permission mode (``--mode``), from ``turn/start`` and at each step (a
        #: plan's approval changes it); "" until known.
        self.mode = ""
        self.started = time.monotonic()
        self.visible = True
        self._shown = False
        self._frame = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        _status_lines.add(self)

    def pause(self) -> None:
        """Erase the line now; :func:`status_paused` keeps it from being redrawn."""
        with self._lock:
            self._erase()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._tick, name="dsh-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1)
        with self._lock:
            self._erase()

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self.draw()

    def _erase(self) -> None:
        if self._shown:
            self._write("\r\x1b[K")
            self._shown = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self._stop.set()

    def line(self) -> str:
        elapsed = time.monotonic() - self.started
        frame = self.FRAMES[self._frame % len(self.FRAMES)]
        step = f"step {self.step} · " if self.step else ""
        step += f"{escape_controls(self.mode, newlines=False)} · " if self.mode else ""
        # The activity names a tool the model asked for: its controls are made visible.
        activity = escape_controls(self.activity, newlines=False)
        tasks = f" · {escape_controls(self.tasks, newlines=False)}" if self.tasks else ""
        text = f"{frame} {step}{activity}{tasks} · {elapsed:.1f}s"
        import shutil

        width = shutil.get_terminal_size((80, 24)).columns - 1
        text = one_line(text, width)
        return click.style(text, dim=True) if self.color else text

    def draw(self) -> None:
        with self._lock:
            if self._stop.is_set() or not self.visible or _pauses:
                return
            self._frame += 1
            self._write("\r" + self.line() + "\x1b[K")
            self._shown = True

    def hide(self) -> None:
        """Erase the line and keep it hidden (text is about to go to the same terminal)."""
        with self._lock:
            self.visible = False
            self._erase()

    def show(self) -> None:
        with self._lock:
            self.visible = True

    def note(self, message: str, *, styled: bool = False) -> None:
        """Print ``message`` on its own line of stderr without garbling the status line;
        ``styled``: it is already escaped and coloured by dsh (a diff), written as it is."""
        with self._lock:
            was_shown = self._shown
            self._erase()
            self._write((message if styled else escape_controls(message)) + "\n")
            if was_shown:
                self.draw()  # redrawn at once below the line, not at the next tick

    def on_event(self, event: Any) -> None:
        kind = getattr(event, "type", "")
        with self._lock:
            if kind == "turn/start" and getattr(event, "mode", "") and not getattr(
                    event, "parent", None):  # a sub-agent's first turn names its parent
                self.mode = event.mode
            if kind == "step/start":
                self.step = event.step + 1
                self.activity = "waiting for the model"
                run = sys.modules.get("dsh.host.runcontext")  # loaded by then; not imported here
                ctx = run.current_or_none() if run is not None else None
                if ctx is not None and ctx.parent is None:
                    self.mode = ctx.mode
            elif kind == "tool/call":
                self.activity = f"running tool {event.name}"
            elif kind == "tool/result":
                self.activity = f"tool {event.name} returned"
            elif kind == "assistant/message":
                self.activity = "thinking"
            elif kind == "llm/stream":
                self.activity = "receiving"
            elif kind == "context/compacting":  # a summary request may take a while
                self.activity = "compacting the history"
            elif kind == "context/compacted":
                self.activity = "waiting for the model"
            elif kind == "llm/retry":  # a failed request is sent again after a wait
                data = getattr(event, "data", {})
                why = f"HTTP {data.get('status')}" if data.get("status") else "a failure"
                self.activity = (f"retry {data.get('attempt')}/{data.get('retries')} "
                                 f"after {why}")
            elif kind == "x" and getattr(event, "plugin", "") == "dsh.tasks":
                from dsh.run.tasks import summary

                try:
                    self.tasks = summary(event.data["tasks"])
                except (KeyError, TypeError):  # a hand-made line: no progress to show
                    pass
