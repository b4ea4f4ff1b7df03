"""Human and machine output of the command line (docs/cli.md).

* the trajectory view (``dsh sessions show``), the Markdown export and the sessions table —
  renderings of the session ledger only (MISSION C5);
* the live output of ``dsh run`` (:class:`RunOutput`): the status line on stderr, streamed
  text, ``--events`` lines and the ``--json`` object, a stdout that survives a closed pipe,
  and the Ctrl-C policy (:class:`Interrupt`);
* the inventories of ``dsh plugins``, ``tools``, ``models`` and ``agents``.

Colour is used only when asked for (:func:`use_color`: a terminal, and ``NO_COLOR`` unset).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from datetime import datetime
from typing import IO
from typing import TYPE_CHECKING
from typing import Any

import click

from dsh.events import AssistantMessage
from dsh.events import ContextInjected
from dsh.events import Event
from dsh.events import StepRejected
from dsh.events import StepStarted
from dsh.events import ToolCalled
from dsh.events import ToolReturned
from dsh.events import TurnEnded
from dsh.events import TurnStarted
from dsh.events import UnknownEvent
from dsh.events import UserMessage

if TYPE_CHECKING:
    from dsh.runcontext import RunContext

#: Lines of a tool's output shown by ``dsh sessions show`` (``--full`` shows everything).
TOOL_OUTPUT_LINES = 12
TOOL_OUTPUT_CHARS = 2000


def use_color(stream: IO[str]) -> bool:
    """Colour only on a terminal, and never when ``NO_COLOR`` is set (https://no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def local_time(ts: str) -> str:
    """``2026-11-30T14:25:01.123Z`` as local ``2026-11-30 15:25``; unparseable text as is."""
    try:
        return datetime.fromisoformat(ts).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return ts


def one_line(text: str, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(0, width - 1)] + "…"


def sessions_table(rows: Iterable[Any], width: int | None = None) -> str:
    """The ``dsh sessions list`` table: id, agent, model, start, turns, first prompt (``↳``
    marks a sub-agent's session)."""
    header = ("ID", "AGENT", "MODEL", "STARTED", "TURNS", "FIRST PROMPT")
    cells = [header] + [
        (r.id, r.agent, r.model, local_time(r.started) if r.started else "", str(r.turns),
         ("↳ " if getattr(r, "parent", None) else "") + r.first_prompt)
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    used = sum(widths) + 2 * 5
    last = max(20, (width or 100) - used)
    lines = []
    for c in cells:
        fixed = "  ".join(v.ljust(w) for v, w in zip(c[:5], widths, strict=True))
        lines.append((fixed + "  " + one_line(c[5], last)).rstrip())
    return "\n".join(lines)


def _args(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=False)


def _truncate(text: str, full: bool) -> str:
    if full:
        return text
    lines = text.splitlines()
    cut = lines[:TOOL_OUTPUT_LINES]
    out = "\n".join(cut)
    if len(out) > TOOL_OUTPUT_CHARS:
        out = out[:TOOL_OUTPUT_CHARS]
    hidden = len(text) - len(out)
    if hidden > 0:
        out += f"\n… ({len(lines) - len(cut)} more lines, {hidden} more characters; --full)"
    return out


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


class _Styler:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, **style: Any) -> str:
        return click.style(text, **style) if self.color else text


#: How deep ``dsh sessions show`` follows sub-agent sessions (the runtime's own bound is 8).
MAX_NESTING = 8


def trajectory(events: Iterable[Event], *, color: bool = False, full: bool = False,
               children: Callable[[str], Iterable[Event]] | None = None,
               depth: int = 0) -> str:
    """The USER / ASSISTANT / TOOL timeline of a session, rendered from its ledger events.

    :param children: reads a child session's events: a sub-agent's session is then shown
        under the tool call that started it, indented with ``│``.
    """
    s = _Styler(color)
    out: list[str] = []
    usage = [0, 0]
    steps = 0

    def block(label: str, text: str, style: dict[str, Any], note: str = "") -> None:
        head = s(label, bold=True, **style) + (s(" " + note, dim=True) if note else "")
        out.append(head)
        if text.strip():
            out.append(_indent(text.rstrip("\n")))

    for e in events:
        if isinstance(e, TurnStarted):
            usage, steps = [0, 0], 0
            bits = [f"agent {e.agent}"] + ([f"model {e.model}"] if e.model else [])
            if e.tools is not None:
                bits.append(f"tools: {', '.join(t.name for t in e.tools) or 'none'}")
            if e.parent:
                bits.append(f"sub-agent of session {e.parent}")
            out.append(s(f"━━ turn {e.turn} ━━ ", fg="cyan", bold=True)
                       + s(" · ".join(bits), dim=True))
            if e.system:
                block("SYSTEM", e.system if full else _truncate(e.system, False),
                      {"fg": "white"})
        elif isinstance(e, StepStarted):
            steps += 1
            if e.step:
                out.append(s(f"· step {e.step + 1}", dim=True))
        elif isinstance(e, ContextInjected):
            block("CONTEXT", e.text, {"fg": "magenta"}, f"(injected by {e.source})")
        elif isinstance(e, UserMessage):
            note = f"({e.source})" if e.source != "user" else ""
            block("USER", e.text, {"fg": "green"}, note)
        elif isinstance(e, AssistantMessage):
            usage[0] += e.usage.input_tokens
            usage[1] += e.usage.output_tokens
            notes = []
            if e.tool_call_source and e.tool_call_source != "native":
                notes.append(f"tool calls rescued from text ({e.tool_call_source})")
            if e.stop_reason and e.stop_reason not in ("end_turn", "tool_use", "stop"):
                notes.append(f"stop: {e.stop_reason}")
            block("ASSISTANT", e.text, {"fg": "blue"}, " · ".join(notes))
        elif isinstance(e, ToolCalled):
            child = f" (session {e.child_session})" if e.child_session else ""
            out.append(s("  → ", fg="yellow") + s(e.name, bold=True)
                       + " " + _args(e.arguments) + s(child, dim=True))
            if e.child_session and children is not None and depth < MAX_NESTING:
                out.append(_nested(e.child_session, children, s, color, full, depth))
        elif isinstance(e, ToolReturned):
            ok = e.status == "ok"
            took = f" · {e.duration_ms:.0f} ms" if e.duration_ms is not None else ""
            block(f"TOOL {e.name}", _truncate(e.output, full),
                  {"fg": "yellow" if ok else "red"}, f"{e.status}{took}")
        elif isinstance(e, StepRejected):
            by = f" by {e.plugin}" if e.plugin else ""
            block("REJECTED", e.text, {"fg": "red"}, f"step {e.step + 1}{by}: {e.reason}")
        elif isinstance(e, TurnEnded):
            style = {"fg": "cyan"} if e.outcome == "completed" else {"fg": "red"}
            reason = f" ({e.reason})" if e.reason else ""
            tail = f"{steps} step{'s' if steps != 1 else ''}"
            if usage != [0, 0]:
                tail += f" · {usage[0]} in / {usage[1]} out tokens"
            out.append(s(f"━━ turn {e.turn} {e.outcome}{reason} ━━ ", bold=True, **style)
                       + s(tail, dim=True))
            out.append("")
        elif isinstance(e, UnknownEvent):
            out.append(s(f"? {e.tag} (event type unknown to this dsh)", dim=True))
    return "\n".join(out).rstrip("\n") + "\n" if out else ""


def _nested(session: str, children: Callable[[str], Iterable[Event]], s: _Styler,
            color: bool, full: bool, depth: int) -> str:
    from dsh.errors import DshError

    try:
        text = trajectory(children(session), color=color, full=full, children=children,
                          depth=depth + 1)
    except DshError as exc:
        text = f"(session {session} cannot be read: {exc})\n"
    bar = s("    │ ", dim=True)
    return "\n".join(bar + line for line in text.rstrip("\n").splitlines())


def _fence(text: str, lang: str = "") -> str:
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip(chr(10))}\n{fence}"


def markdown(session_id: str, events: Iterable[Event]) -> str:
    """The session as a Markdown document (``dsh sessions export --format markdown``)."""
    parts: list[str] = [f"# Session {session_id}"]
    for e in events:
        if isinstance(e, TurnStarted):
            meta = [f"agent `{e.agent}`"] + ([f"model `{e.model}`"] if e.model else [])
            parts.append(f"## Turn {e.turn}\n\n_{', '.join(meta)} · {e.ts}_")
            if e.system:
                parts.append("**System**\n\n" + _fence(e.system))
        elif isinstance(e, ContextInjected):
            parts.append(f"**Context** (injected by `{e.source}`)\n\n" + _fence(e.text))
        elif isinstance(e, UserMessage):
            src = f" (`{e.source}`)" if e.source != "user" else ""
            parts.append(f"**User**{src}\n\n{e.text.strip()}")
        elif isinstance(e, AssistantMessage):
            if e.text.strip():
                parts.append(f"**Assistant**\n\n{e.text.strip()}")
        elif isinstance(e, ToolCalled):
            parts.append(f"**Tool call** `{e.name}`\n\n"
                         + _fence(json.dumps(e.arguments, ensure_ascii=False, indent=2), "json"))
        elif isinstance(e, ToolReturned):
            parts.append(f"**Tool result** `{e.name}` ({e.status})\n\n" + _fence(e.output))
        elif isinstance(e, StepRejected):
            by = f" by `{e.plugin}`" if e.plugin else ""
            parts.append(f"**Step rejected**{by}: {e.reason}")
        elif isinstance(e, TurnEnded):
            reason = f": {e.reason}" if e.reason else ""
            parts.append(f"_Turn {e.turn} {e.outcome}{reason}_")
    return "\n\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------
# Live output of `dsh run`
# --------------------------------------------------------------------------------------------


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
        self.started = time.monotonic()
        self.visible = True
        self._shown = False
        self._frame = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        text = f"{frame} {step}{self.activity} · {elapsed:.1f}s"
        import shutil

        width = shutil.get_terminal_size((80, 24)).columns - 1
        text = one_line(text, width)
        return click.style(text, dim=True) if self.color else text

    def draw(self) -> None:
        with self._lock:
            if self._stop.is_set() or not self.visible:
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
            self._write(message + "\n")

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
    ``on_closed`` (``dsh run`` stops the run there) and turns later writes into no-ops."""

    def __init__(self, on_closed: Callable[[], None] | None = None) -> None:
        self.closed = False
        self.on_closed = on_closed
        self._lock = threading.Lock()

    def write(self, text: str) -> None:
        import sys

        with self._lock:
            if self.closed:
                return
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except BrokenPipeError:
                self.closed = True
                silence_stdout()
        if self.closed and self.on_closed is not None:
            self.on_closed()


def event_line(event: Any) -> str:
    """The ``--events`` line of an event: a persistent event's ledger line, byte for byte, or
    a live event's ``{"type": ..., **data}``."""
    if isinstance(event, Event):
        from dsh.serialize import dump_event

        return dump_event(event)
    return _compact({"type": getattr(event, "type", "live"), **getattr(event, "data", {})})


def _compact(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)


def result_dict(result: Any, agent: str = "", model: str = "") -> dict[str, Any]:
    """The ``--json`` object (and the last ``--events`` line) of a run's result."""
    return {
        "session": result.session_id,
        "agent": agent,
        "model": model,
        "outcome": result.outcome,
        "reason": result.reason,
        "output": result.output,
        "steps": result.steps,
        "usage": {"input_tokens": result.usage.input_tokens,
                  "output_tokens": result.usage.output_tokens},
        "path": str(result.path) if result.path else None,
    }


class Interrupt:
    """SIGINT during a run: the first stops after the current step (``ctx.stop()``), the
    second aborts at once (KeyboardInterrupt; the turn is closed as ``aborted``)."""

    def __init__(self, note: Any) -> None:
        self.ctx: RunContext | None = None
        self.count = 0
        self.note = note
        self._old: Any = None
        self._installed = False

    def attach(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT,
                          self._old if self._old is not None else signal.default_int_handler)

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
        self.timed_out = False
        self.interrupts = 0
        stdout_tty = sys.stdout.isatty()
        self.streaming = stream if stream is not None else (
            stdout_tty and not (events or as_json))
        self.status = (StatusLine(sys.stderr, color=use_color(sys.stderr))
                       if sys.stderr.isatty() else None)
        self._handlers: list[Callable[[Any], None]] = []
        if events:
            self._handlers.append(lambda e: out.write(event_line(e) + "\n"))
        self.printer: TextPrinter | None = None
        if self.streaming:
            shared = self.status if stdout_tty else None
            self.printer = TextPrinter(out.write, shared.hide if shared else None,
                                       shared.show if shared else None)
            self._handlers.append(self.printer.on_event)
        if self.status is not None:
            self._handlers.append(self.status.on_event)

    def run(self, session: Any, text: str, *, timeout: float | None = None,
            approve: bool = False, limits: Any = None) -> Any:
        """``session.send(text)`` with this output attached, Ctrl-C handled (:class:`Interrupt`)
        and ``timeout`` enforced: checked between steps, and an in-flight model call or tool
        is aborted when it expires (:attr:`timed_out`). A closed stdout stops the run."""
        from dsh.app import RunResult
        from dsh.messages import Usage
        from dsh.runcontext import Limits

        interrupt = Interrupt(self.note)
        self.out.on_closed = lambda: interrupt.ctx.stop() if interrupt.ctx else None

        def expire() -> None:
            self.timed_out = True
            if interrupt.ctx is not None:
                interrupt.ctx.abort(f"time limit reached ({timeout:g}s)")

        def attach(ctx: RunContext) -> None:
            interrupt.attach(ctx)
            if self.out.closed:  # the reader left before the run began
                ctx.stop()

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
                    text, on_event=self.on_event, on_text=self.on_text,
                    limits=(limits or Limits()).merged(Limits(seconds=timeout) if timeout
                                                       else None),
                    context_hook=attach, approve=approve)
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
            if timer is not None:
                timer.cancel()
            if self.status is not None:
                self.status.stop()

    def note(self, message: str) -> None:
        """A line on stderr that does not garble the status line."""
        if self.status is not None:
            self.status.note(message)
        else:
            click.echo(message, err=True)

    def begin(self, session: str, agent: str, model: str, resumed: bool) -> None:
        if self.events:
            self.out.write(_compact({"type": "session", "session": session, "agent": agent,
                                     "model": model, "resumed": resumed}) + "\n")
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
        return self.printer.on_text if self.printer is not None else None

    def finish(self, result: Any, agent: str, model: str) -> None:
        """Print the result in the form asked for."""
        data = result_dict(result, agent, model)
        if self.events:
            self.out.write(_compact({"type": "result", **data}) + "\n")
        elif self.as_json:
            self.out.write(_compact(data) + "\n")
        elif self.printer is not None and self.printer.printed:
            self.printer.finish()
        elif result.output and result.outcome not in ("error", "aborted"):
            text = result.output
            self.out.write(text if text.endswith("\n") else text + "\n")

    def fail(self, reason: str) -> None:
        """The result line/object of a run that could not start (``--json``/``--events``)."""
        data = {"session": None, "outcome": "error", "reason": reason, "output": "",
                "steps": 0, "usage": {"input_tokens": 0, "output_tokens": 0}}
        if self.events:
            self.out.write(_compact({"type": "result", **data}) + "\n")
        elif self.as_json:
            self.out.write(_compact(data) + "\n")


# --------------------------------------------------------------------------------------------
# Inventories: dsh plugins / tools / models / agents
# --------------------------------------------------------------------------------------------


def plugin_rows(app: Any, commands: dict[str, list[str]], builtins: bool) -> list[dict[str, Any]]:
    """One row per plugin: name, distribution and version, hooks it implements, agents that
    use it, commands it adds, whether it is disabled, and its load error."""
    from dsh.errors import DshError
    from dsh.manager import BUILTIN_PLUGINS

    pm = app.pm
    using: dict[str, list[str]] = {}
    for name in app.config.agent_names():
        try:
            for p in app.agent(name).plugin_names:
                using.setdefault(p, []).append(name)
        except DshError as exc:
            click.echo(f"dsh: warning: agent {name}: {exc}", err=True)
    rows: list[dict[str, Any]] = [
        {"name": name, "builtin": True, "dist": "", "version": "", "agents": ["*"],
         "error": None} for name in (BUILTIN_PLUGINS if builtins else ())
    ]
    rows += [{"name": r.name, "builtin": False, "dist": r.dist, "version": r.version,
              "agents": using.get(r.name, []), "error": r.error} for r in app.plugins]
    for row in rows:
        obj = pm.get_plugin(row["name"])
        row["disabled"] = pm.is_blocked(row["name"])
        row["hooks"] = sorted(h.name for h in pm.get_hookcallers(obj) or ()) if obj else []
        row["commands"] = sorted(commands.get(row["name"], []))
    return rows


def plugins_text(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        origin = "built-in" if row["builtin"] else " ".join(
            x for x in (row["dist"], row["version"]) if x) or "module"
        lines.append(f"{row['name']}  {origin}{' (disabled)' if row['disabled'] else ''}")
        lines.append(f"  hooks: {', '.join(row['hooks']) or '-'}")
        lines.append(f"  agents: {', '.join(row['agents']) or '-'}")
        if row["commands"]:
            lines.append(f"  commands: {', '.join(row['commands'])}")
        if row["error"]:
            lines.append(f"  error: {row['error']}")
    return "\n".join(lines)


def tool_rows(tools: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"name": t.name, "plugin": t.plugin, "description": t.description,
             "parameters": t.parameters} for t in tools]


def tools_text(rows: list[dict[str, Any]]) -> str:
    """``name(param: type, optional?: type)  [plugin]`` and the description's first line."""
    lines = []
    for t in rows:
        props = t["parameters"].get("properties", {})
        required = set(t["parameters"].get("required", ()))
        params = ", ".join(f"{n}{'' if n in required else '?'}: {s.get('type', 'any')}"
                           for n, s in props.items())
        lines.append(f"{t['name']}({params})  [{t['plugin']}]")
        if t["description"]:
            lines.append(f"  {t['description'].splitlines()[0]}")
    return "\n".join(lines)


def models_report(app: Any) -> dict[str, Any]:
    return {
        "default": app.config.model,
        "adapters": [{"prefix": e.prefix, "plugin": e.plugin, "description": e.description}
                     for e in app.models.values()],
        "configured": [{"id": k, "adapter": v.get("adapter", k.partition(":")[0])}
                       for k, v in app.config.models.items()],
    }


def models_text(report: dict[str, Any]) -> str:
    adapters = report["adapters"]
    width = max((len(a["prefix"]) for a in adapters), default=0)
    lines = [f"{a['prefix'].ljust(width)}  {a['description']}  [{a['plugin']}]"
             for a in adapters]
    lines += [f"{c['id']}  (configured, adapter {c['adapter']})" for c in report["configured"]]
    lines.append(f"default: {report['default']}")
    return "\n".join(lines)


def agent_rows(app: Any) -> list[dict[str, Any]]:
    rows = []
    for name in app.config.agent_names():
        a = app.agent(name)
        rows.append({"name": name, "default": name == app.config.agent, "model": a.model_id,
                     "max_steps": a.max_steps, "plugins": list(a.plugin_names),
                     "tools": list(a.tools),
                     "prompt": [{"plugin": p.plugin, "name": p.name, "order": p.order}
                                for p in a.prompt_parts]})
    return rows


def agents_text(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        lines.append(f"{r['name']}{' (default)' if r['default'] else ''}")
        lines.append(f"  model: {r['model']}  max_steps: {r['max_steps']}")
        lines.append(f"  plugins: {', '.join(r['plugins']) or '-'}")
        lines.append(f"  tools: {', '.join(r['tools']) or '-'}")
        parts = [f"{p['plugin']}:{p['name'] or '-'}@{p['order']}" for p in r["prompt"]]
        lines.append(f"  prompt: {', '.join(parts) or '-'}")
    return "\n".join(lines)
