"""What ``dsh run`` prints while it runs (docs/cli.md): :class:`RunOutput` — streamed text,
``--events`` and ``--json`` lines (:func:`event_line`), the status line on a terminal, the
result — and :class:`Interrupt`, the run's signals (Ctrl-C, SIGTERM, SIGHUP).

The pieces it is built from: the status line in :mod:`dsh.cli.status`, stdout and the printers
of streamed text in :mod:`dsh.cli.streams`, escaping for a terminal in :mod:`dsh.cli.escape`
(their names are re-exported here). Views of a finished session (the trajectory, Markdown,
tables) are in :mod:`dsh.cli.render`.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

import click

from dsh.cli.escape import escape_controls as escape_controls  # re-exported
from dsh.cli.escape import escape_json_controls as escape_json_controls  # re-exported
from dsh.cli.escape import one_line as one_line  # re-exported
from dsh.cli.escape import use_color as use_color  # re-exported
from dsh.cli.status import StatusLine as StatusLine  # re-exported
from dsh.cli.status import asking as asking  # re-exported
from dsh.cli.status import status_paused as status_paused  # re-exported
from dsh.cli.streams import ReasoningPrinter as ReasoningPrinter  # re-exported
from dsh.cli.streams import Stdout as Stdout  # re-exported
from dsh.cli.streams import TextPrinter as TextPrinter  # re-exported
from dsh.cli.streams import silence_stdout as silence_stdout  # re-exported
from dsh.ledger.events import Event
from dsh.run.result import compact_json as _compact
from dsh.run.result import result_dict as result_dict  # re-exported

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext


def event_line(event: Any) -> str:
    """The ``--events`` line of an event: a persistent event's ledger line, byte for byte, or
    a live event's ``{"type": ..., **data}``."""
    if isinstance(event, Event):
        from dsh.ledger.serialize import dump_event

        return dump_event(event)
    return _compact({"type": getattr(event, "type", "live"), **getattr(event, "data", {})})


def _discard(delta: str) -> None:
    """A text sink that shows nothing (the run still streams: ``--timeout`` keeps the text)."""


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


class Interrupt:
    """Signals during a run. SIGINT: the first aborts the current step now (``ctx.abort``:
    the model's stream is closed, a running command's process group killed; the text
    streamed so far is recorded as the step's answer and the turn closes as ``aborted``);
    the second raises KeyboardInterrupt at once, whatever still runs.

    SIGTERM and SIGHUP end the run as the second Ctrl-C does, at once: the run is aborted
    (its cancel callbacks kill a running command's process group and close in-flight HTTP),
    KeyboardInterrupt closes the turn as ``aborted``, and :attr:`terminated` holds the signal
    so that ``dsh run`` exits with 128 + its number (143, 129). Further ones are ignored
    while the turn closes.

    A run a signal ended may be over before a quick second Ctrl-C comes (the first one ended
    it at once): a Ctrl-C within :attr:`GRACE` seconds of its end is taken as part of the
    same interrupt (ignored while dsh closes the session), not as a KeyboardInterrupt."""

    TERMINATING = (signal.SIGTERM, signal.SIGHUP)
    GRACE = 2.0

    def __init__(self, note: Any) -> None:
        self.ctx: RunContext | None = None
        self.count = 0
        self.note = note
        self.terminated: int | None = None
        self._old: dict[int, Any] = {}
        self._interrupt: Callable[[], None] = _raise_interrupt

    def attach(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> Interrupt:
        # imported here, not in the handlers (a handler must not import) nor at the top
        # (`dsh --help` reaches this module and needs no ledger)
        from dsh.ledger.writer import interrupt_or_defer

        self._interrupt = interrupt_or_defer
        if threading.current_thread() is threading.main_thread():
            self._old[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
            for signum in self.TERMINATING:
                self._old[signum] = signal.signal(signum, self._terminate)
        return self

    def __exit__(self, *exc: object) -> None:
        ended = self.count > 0 or self.terminated is not None
        for signum, old in self._old.items():
            if isinstance(old, _Grace):
                old = old.then
            if old is None:
                old = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            if ended and signum == signal.SIGINT:
                old = _Grace(old, time.monotonic() + self.GRACE)
            signal.signal(signum, old)
        self._old = {}

    def _abort_now(self, ctx: RunContext) -> None:
        """The first Ctrl-C: abort the run, then the notice (on its own line)."""
        ctx.abort("interrupted")
        self.note("dsh: interrupted: stopping now (Ctrl-C again to abort at once)")

    def _terminate(self, signum: int, frame: Any) -> None:
        if self.terminated is not None:
            return  # already ending: let the turn close
        self.terminated = signum
        if self.ctx is not None:
            self.ctx.abort(f"terminated by {signal.Signals(signum).name}")
        self._interrupt()

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1 and self.ctx is not None:
            # Not here, in the handler: the main thread may hold a lock the abort's callbacks
            # take (the cancel token's, the HTTP client's) or be writing to the terminal.
            threading.Thread(target=self._abort_now, args=(self.ctx,), name="dsh-interrupt",
                             daemon=True).start()
            return
        if self.ctx is not None:
            self.ctx.abort("interrupted")
        self._interrupt()


class _Grace:
    """A SIGINT handler for the moments after an interrupted run: until ``until``
    (monotonic) a Ctrl-C is ignored; after it, ``then`` (the handler from before the run) is
    put back and handles this one. The interpreter drops Python handlers as it exits (when
    no KeyboardInterrupt could end it with its own code, 130): from the ``atexit`` callbacks
    on, SIGINT is then ignored — what is left to do is closing, each step bounded."""

    def __init__(self, then: Any, until: float) -> None:
        import atexit

        self.then = then
        self.until = until
        atexit.register(self._exiting)

    def _exiting(self) -> None:
        if signal.getsignal(signal.SIGINT) is self:
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __call__(self, signum: int, frame: Any) -> None:
        if time.monotonic() < self.until:
            return
        signal.signal(signum, self.then)
        if callable(self.then):
            self.then(signum, frame)
        elif self.then == signal.SIG_DFL:
            os.kill(os.getpid(), signum)


class RunOutput:
    """Everything ``dsh run`` shows while a turn runs and when it ends.

    * ``--events``: a ``session`` line, every event (:func:`event_line`), a ``result`` line;
    * ``--json``: the :func:`result_dict` object at the end;
    * streaming (``--stream``, or stdout is a terminal): text deltas as they arrive;
    * otherwise the final output, with a trailing newline.

    The status line is shown when stderr is a terminal; it steps aside while streamed text
    shares the terminal. Below it, unless ``quiet`` (``-q``), the lines of the run's work stay
    on stderr (:class:`dsh.cli.progress.WorkLog`: tool calls and results, approvals, retries);
    a caller that adds its own event handler before the run starts (``dsh chat``'s tool lines)
    shows tool calls itself, and the work log then leaves them out. With nothing to show live,
    :attr:`on_event` is ``None`` and the run stays unobserved (MISSION D7).
    """

    def __init__(self, out: Stdout, *, events: bool = False, as_json: bool = False,
                 stream: bool | None = None, quiet: bool = False) -> None:
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
        #: visible (:func:`dsh.cli.escape.escape_controls`); a pipe gets every byte.
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
        #: The lines of the run's work on stderr (a terminal only, not ``quiet``), else None.
        self.work: Any = None
        if self.status is not None and not quiet:
            from dsh.cli.progress import WorkLog

            self.work = WorkLog(lambda line: self.note(line, styled=True),
                                color=self.status.color, ctx=lambda: self.ctx)
            self._handlers.append(self.work.on_event)
        if self.status is not None:
            self._handlers.append(self.status.on_event)
        self._own = len(self._handlers)  # handlers added later by a caller are its own

    def run(self, session: Any, text: str, *, timeout: float | None = None,
            approve: bool = False, limits: Any = None) -> Any:
        """``session.send(text)`` with this output attached, Ctrl-C handled (:class:`Interrupt`)
        and ``timeout`` enforced: checked between steps, and an in-flight model call or tool
        is aborted when it expires (:attr:`timed_out`; the text streamed so far is kept, as
        after a Ctrl-C). A closed stdout stops the run."""
        from dsh.core.messages import Usage
        from dsh.host.runcontext import Limits
        from dsh.run.app import RunResult

        def interrupted(message: str) -> None:
            if self.printer is not None:
                self.printer.finish()  # the answer so far ends its line; the notice has its own
            self.note(message)

        interrupt = Interrupt(interrupted)
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
            on_text = self.on_text
            if on_text is None and timeout:
                on_text = _discard  # streamed, even unshown: the text before the limit is kept
            with interrupt:
                return session.send(
                    text, on_event=on_event, on_text=on_text, on_reasoning=self.on_reasoning,
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
            if self.work is not None:
                self.work.flush()  # lines held while a question was on the terminal
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

    def note(self, message: str, *, styled: bool = False) -> None:
        """A line on stderr that does not garble the status line; ``styled``: already escaped
        and coloured by dsh (a recorded diff), written as it is."""
        if self.status is not None:
            self.status.note(message, styled=styled)
        else:
            click.echo(escape_controls(message) if self.err_tty and not styled else message,
                       err=True)

    def begin(self, session: str, agent: str, model: str, resumed: bool) -> None:
        if self.events:
            self.write_json(_compact({"type": "session", "session": session, "agent": agent,
                                      "model": model, "resumed": resumed}))
        if self.work is not None:
            self.work.session = session
            if len(self._handlers) > self._own:  # the caller shows tool calls itself
                self.work.tools = False
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
        self._own += 1

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
        elif result.output and result.outcome != "error":  # aborted: the output so far
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
