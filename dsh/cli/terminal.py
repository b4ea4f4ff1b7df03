"""What ``dsh run`` prints while it runs (docs/cli.md): stdout that survives a closed pipe,
streamed text, ``--events`` and ``--json`` lines, the status line on a terminal, and Ctrl-C.

Views of a finished session (the trajectory, Markdown, tables) are in :mod:`dsh.render`.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO
from typing import TYPE_CHECKING
from typing import Any

import click

from dsh.cli.render import escape_controls
from dsh.cli.render import escape_json_controls
from dsh.cli.render import one_line
from dsh.cli.render import use_color
from dsh.ledger.events import Event
from dsh.run.result import compact_json as _compact
from dsh.run.result import result_dict as result_dict  # re-exported

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext


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

    def note(self, message: str) -> None:
        """Print ``message`` on its own line of stderr without garbling the status line."""
        with self._lock:
            self._erase()
            self._write(escape_controls(message) + "\n")

    def on_event(self, event: Any) -> None:
        kind = getattr(event, "type", "")
        with self._lock:
            if kind == "step/start":
                self.step = event.step + 1
                self.activity = "waiting for the model"
            elif kind == "tool/call":
                self.activity = f"running tool {event.name}"
            elif kind == "tool/result":
                self.activity = f"tool {event.name} returned"
            elif kind == "assistant/message":
                self.activity = "thinking"
            elif kind == "llm/stream":
                self.activity = "receiving"
            elif kind == "x" and getattr(event, "plugin", "") == "dsh.tasks":
                from dsh.run.tasks import summary

                try:
                    self.tasks = summary(event.data["tasks"])
                except (KeyError, TypeError):  # a hand-made line: no progress to show
                    pass


class TextPrinter:
    """Writes streamed text to stdout. The texts of successive steps are separated by a
    newline, written as soon as the next step or a tool call starts (so the status line has a
    clean line while a tool runs), and the output ends with one. ``hide_status`` is called
    before each write and ``show_status`` once the line is clean again, when the status line
    shares the terminal."""

    def __init__(self, write: Callable[[str], None],
                 hide_status: Callable[[], None] | None = None,
                 show_status: Callable[[], None] | None = None) -> None:
        self.write = write
        self.hide_status = hide_status
        self.show_status = show_status
        self.printed = False
        self.dirty = False  # the last character written was not a newline

    def on_text(self, delta: str) -> None:
        if not delta:
            return
        if self.hide_status is not None:
            self.hide_status()
        self.write(delta)
        self.printed = True
        self.dirty = not delta.endswith("\n")

    def on_event(self, event: Any) -> None:
        if getattr(event, "type", "") in ("step/start", "tool/call"):
            self.finish()
            if self.show_status is not None:
                self.show_status()

    def finish(self) -> None:
        if self.dirty:
            self.write("\n")
            self.dirty = False


class ReasoningPrinter(TextPrinter):
    """A :class:`TextPrinter` for reasoning deltas (``--show-reasoning``): text is written up
    to its last whitespace and the rest held back, so that each word is whole when it passes
    :func:`dsh.core.redact.redact` — a secret split across two deltas is still redacted."""

    #: A word longer than this is written (redacted as far as it goes) without waiting more.
    HOLD = 4096

    def __init__(self, write: Callable[[str], None],
                 hide_status: Callable[[], None] | None = None,
                 show_status: Callable[[], None] | None = None) -> None:
        super().__init__(write, hide_status, show_status)
        self.pending = ""

    def on_text(self, delta: str) -> None:
        text = self.pending + delta
        cut = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t"))
        if cut < 0 and len(text) < self.HOLD:
            self.pending = text
            return
        shown, self.pending = (text[:cut + 1], text[cut + 1:]) if cut >= 0 else (text, "")
        self._out(shown)

    def _out(self, text: str) -> None:
        from dsh.core.redact import redact

        super().on_text(redact(text))

    def finish(self) -> None:
        if self.pending:
            text, self.pending = self.pending, ""
            self._out(text)
        super().finish()


def silence_stdout() -> None:
    """Point file descriptor 1 at ``/dev/null`` after the reader went away, so that the
    interpreter's final flush cannot fail (the recipe of the Python docs for SIGPIPE)."""
    import sys

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return  # not a real file (tests capture stdout): nothing left to flush to fd 1
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class Stdout:
    """stdout that survives a closed pipe: the first ``BrokenPipeError`` silences it, calls
    ``on_closed`` (``dsh run`` stops the run after the step that records the prompt) and
    turns later writes into no-ops. Any other write error (a full disk: stdout on
    ``/dev/full``) does the same and is kept in :attr:`error` for the caller to report. Text
    that cannot be written as UTF-8 (lone surrogates) is written with U+FFFD in their place."""

    def __init__(self, on_closed: Callable[[], None] | None = None) -> None:
        self.closed = False
        #: ``cannot write to standard output: REASON`` when a write failed (not a closed pipe).
        self.error: str | None = None
        self.on_closed = on_closed
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        import sys

        from dsh.core.sanitize import clean_text
        from dsh.core.sanitize import has_surrogates

        if has_surrogates(text):
            text = clean_text(text)[0]
        with self._lock:
            if self.closed:
                return
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except OSError as exc:
                # A closed pipe, or a terminal that hung up (EIO after SIGHUP): the reader
                # is gone either way.
                if not isinstance(exc, BrokenPipeError) and exc.errno != errno.EIO:
                    reason = os.strerror(exc.errno) if exc.errno else str(exc)
                    self.error = ("cannot write to standard output: "
                                  f"{reason[:1].lower()}{reason[1:]}")
                self.closed = True
                silence_stdout()
        if self.closed and self.on_closed is not None:
            self.on_closed()


def event_line(event: Any) -> str:
    """The ``--events`` line of an event: a persistent event's ledger line, byte for byte, or
    a live event's ``{"type": ..., **data}``."""
    if isinstance(event, Event):
        from dsh.ledger.serialize import dump_event

        return dump_event(event)
    return _compact({"type": getattr(event, "type", "live"), **getattr(event, "data", {})})


class Interrupt:
    """Signals during a run. SIGINT: the first stops after the current step (``ctx.stop()``),
    the second aborts at once (KeyboardInterrupt; the turn is closed as ``aborted``).

    SIGTERM and SIGHUP end the run as the second Ctrl-C does, at once: the run is aborted
    (its cancel callbacks kill a running command's process group and close in-flight HTTP),
    KeyboardInterrupt closes the turn as ``aborted``, and :attr:`terminated` holds the signal
    so that ``dsh run`` exits with 128 + its number (143, 129). Further ones are ignored
    while the turn closes."""

    TERMINATING = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, note: Any) -> None:
        self.ctx: RunContext | None = None
        self.count = 0
        self.note = note
        self.terminated: int | None = None
        self._old: dict[int, Any] = {}

    def attach(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._old[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
            for signum in self.TERMINATING:
                self._old[signum] = signal.signal(signum, self._terminate)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, old in self._old.items():
            if old is None:
                old = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, old)
        self._old = {}

    def _terminate(self, signum: int, frame: Any) -> None:
        if self.terminated is not None:
            return  # already ending: let the turn close
        self.terminated = signum
        if self.ctx is not None:
            self.ctx.abort(f"terminated by {signal.Signals(signum).name}")
        raise KeyboardInterrupt

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1 and self.ctx is not None:
            self.ctx.stop()
            self.note("dsh: stopping after the current step (Ctrl-C again to abort)")
            return
        if self.ctx is not None:
            self.ctx.abort("interrupted")
        raise KeyboardInterrupt


class RunOutput:
    """Everything ``dsh run`` shows while a turn runs and when it ends.

    * ``--events``: a ``session`` line, every event (:func:`event_line`), a ``result`` line;
    * ``--json``: the :func:`result_dict` object at the end;
    * streaming (``--stream``, or stdout is a terminal): text deltas as they arrive;
    * otherwise the final output, with a trailing newline.

    The status line is shown when stderr is a terminal; it steps aside while streamed text
    shares the terminal. With nothing to show live, :attr:`on_event` is ``None`` and the run
    stays unobserved (MISSION D7).
    """

    def __init__(self, out: Stdout, *, events: bool = False, as_json: bool = False,
                 stream: bool | None = None) -> None:
        import sys

        self.out = out
        self.events = events
        self.as_json = as_json
        #: ``--schema``: the JSON Schema the answer must match (stdout is then exactly the
        #: JSON document; nothing is streamed).
        self.schema: Any = None
        self.timed_out = False
        self.interrupts = 0
        #: The running turn's context (``stop()``/``abort()`` from another thread), else None.
        self.ctx: RunContext | None = None
        #: SIGTERM or SIGHUP ended the run (its number), else None.
        self.terminated: int | None = None
        stdout_tty = sys.stdout.isatty()
        #: stdout is a terminal: text from the model and tools has its controls made
        #: visible (:func:`dsh.cli.render.escape_controls`); a pipe gets every byte.
        self.tty = stdout_tty
        self.err_tty = sys.stderr.isatty()
        self.streaming = stream if stream is not None else (
            stdout_tty and not (events or as_json))
        self.status = (StatusLine(sys.stderr, color=use_color(sys.stderr))
                       if sys.stderr.isatty() else None)
        self._handlers: list[Callable[[Any], None]] = []
        if events:
            self._handlers.append(lambda e: self.write_json(event_line(e)))
        self.printer: TextPrinter | None = None
        #: Prints reasoning deltas on stderr (``--show-reasoning``, :meth:`show_reasoning`).
        self.thoughts: ReasoningPrinter | None = None
        if self.streaming:
            shared = self.status if stdout_tty else None
            self.printer = TextPrinter(self.write_text, shared.hide if shared else None,
                                       shared.show if shared else None)
            self._handlers.append(self.printer.on_event)
        if self.status is not None:
            self._handlers.append(self.status.on_event)

    def run(self, session: Any, text: str, *, timeout: float | None = None,
            approve: bool = False, limits: Any = None) -> Any:
        """``session.send(text)`` with this output attached, Ctrl-C handled (:class:`Interrupt`)
        and ``timeout`` enforced: checked between steps, and an in-flight model call or tool
        is aborted when it expires (:attr:`timed_out`). A closed stdout stops the run."""
        from dsh.core.messages import Usage
        from dsh.host.runcontext import Limits
        from dsh.run.app import RunResult

        interrupt = Interrupt(self.note)
        # The reader went away (``--events | head -1``): stop after the current step, but
        # never before this turn's prompt is in the ledger — the user's message is recorded
        # whatever the reader does, and the turn is closed (outcome ``stopped``).
        recorded = threading.Event()

        def reader_gone() -> None:
            if interrupt.ctx is not None and recorded.is_set():
                interrupt.ctx.stop()

        self.out.on_closed = reader_gone
        handlers = self.on_event

        def watch(event: Any) -> None:
            assert handlers is not None
            handlers(event)
            if getattr(event, "type", "") == "user/message" and not recorded.is_set():
                recorded.set()
                if self.out.closed:
                    reader_gone()

        on_event = watch if handlers is not None else None  # unobserved stays unobserved

        def expire() -> None:
            self.timed_out = True
            if interrupt.ctx is not None:
                interrupt.ctx.abort(f"time limit reached ({timeout:g}s)")

        def attach(ctx: RunContext) -> None:
            interrupt.attach(ctx)
            self.ctx = ctx

        timer = threading.Timer(timeout, expire) if timeout else None
        proj = session.ledger.projection
        start = len(proj)
        self.begin(session.id, session.agent.name, session.agent.model_id, proj.turn > 0)
        try:
            if timer is not None:
                timer.daemon = True
                timer.start()
            with interrupt:
                return session.send(
                    text, on_event=on_event, on_text=self.on_text, on_reasoning=self.on_reasoning,
                    limits=(limits or Limits()).merged(Limits(seconds=timeout) if timeout
                                                       else None),
                    context_hook=attach, approve=approve, output_schema=self.schema)
        except KeyboardInterrupt:  # the second Ctrl-C: send() closed the turn and re-raised
            ctx = interrupt.ctx
            msgs = proj.view()
            last = next((msgs[i].content for i in range(len(msgs) - 1, start - 1, -1)
                         if msgs[i].role == "assistant"), "")
            return RunResult(
                output=last, session_id=session.id, outcome="aborted", reason="interrupted",
                steps=ctx.budget.steps if ctx else 0, path=session.ledger.path,
                usage=Usage(input_tokens=ctx.budget.input_tokens,
                            output_tokens=ctx.budget.output_tokens) if ctx else Usage())
        finally:
            self.interrupts = interrupt.count
            self.terminated = interrupt.terminated
            if timer is not None:
                timer.cancel()
            if self.status is not None:
                self.status.stop()

    def write_text(self, text: str) -> None:
        """Untrusted text (the model's, a tool's) to stdout: controls made visible on a
        terminal, every byte to a pipe or file."""
        self.out.write(escape_controls(text) if self.tty else text)

    def write_json(self, line: str) -> None:
        """A JSON line to stdout; on a terminal, the controls JSON leaves raw (C1, DEL, bidi)
        are written as ``\\uXXXX`` escapes (the same JSON value)."""
        self.out.write((escape_json_controls(line) if self.tty else line) + "\n")

    def note(self, message: str) -> None:
        """A line on stderr that does not garble the status line."""
        if self.status is not None:
            self.status.note(message)
        else:
            click.echo(escape_controls(message) if self.err_tty else message, err=True)

    def begin(self, session: str, agent: str, model: str, resumed: bool) -> None:
        if self.events:
            self.write_json(_compact({"type": "session", "session": session, "agent": agent,
                                      "model": model, "resumed": resumed}))
        if self.status is not None:
            self.status.start()

    @property
    def on_event(self) -> Callable[[Any], None] | None:
        if not self._handlers:
            return None
        handlers = tuple(self._handlers)

        def on_event(event: Any) -> None:
            for handler in handlers:
                handler(event)

        return on_event

    @property
    def on_text(self) -> Callable[[str], None] | None:
        printer, thoughts = self.printer, self.thoughts
        if printer is not None and thoughts is not None:
            def on_text(delta: str) -> None:
                thoughts.finish()  # the reasoning's line ends before the answer starts
                printer.on_text(delta)

            return on_text
        return printer.on_text if printer is not None else None

    def show_reasoning(self) -> None:
        """``--show-reasoning``: reasoning deltas go to stderr as they stream — dimmed and
        with their controls made visible on a terminal, secrets redacted — never to stdout."""
        import sys

        tty = self.err_tty

        def write(text: str) -> None:
            if tty:
                text = click.style(escape_controls(text), dim=True)
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

        status = self.status
        self.thoughts = ReasoningPrinter(write, status.hide if status else None,
                                         status.show if status else None)
        self._handlers.insert(0, self.thoughts.on_event)

    @property
    def on_reasoning(self) -> Callable[[str], None] | None:
        """Receives reasoning deltas (only with :meth:`show_reasoning`; None otherwise, and the
        run is not observed for them)."""
        return self.thoughts.on_text if self.thoughts is not None else None

    def finish(self, result: Any, agent: str, model: str) -> None:
        """Print the result in the form asked for."""
        if self.thoughts is not None:
            self.thoughts.finish()
        data = result_dict(result, agent, model)
        if self.events:
            self.write_json(_compact({"type": "result", **data}))
        elif self.as_json:
            self.write_json(_compact(data))
        elif self.schema is not None:
            if getattr(result, "value", None) is not None and result.outcome == "completed":
                self.write_text(json.dumps(result.value, ensure_ascii=False) + "\n")
        elif self.printer is not None and self.printer.printed:
            self.printer.finish()
        elif result.output and result.outcome not in ("error", "aborted"):
            text = result.output
            self.write_text(text if text.endswith("\n") else text + "\n")

    def fail(self, reason: str) -> None:
        """The result line/object of a run that could not start (``--json``/``--events``)."""
        data = {"session": None, "outcome": "error", "reason": reason, "output": "",
                "steps": 0, "usage": {"input_tokens": 0, "output_tokens": 0}}
        if self.events:
            self.write_json(_compact({"type": "result", **data}))
        elif self.as_json:
            self.write_json(_compact(data))
