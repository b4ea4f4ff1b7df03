"""The input of ``dsh chat`` on a terminal (docs/cli.md), on prompt_toolkit: the prompt is a
line at the bottom of the screen that streamed output never writes into.

* :class:`ChatTerminal` owns the prompts: the one between turns (:meth:`ChatTerminal.read`:
  history, completion of ``/`` commands and ``@`` paths, Alt-Enter or Esc Enter for a
  newline), and the one while a turn runs (:class:`Typing`), whose lines steer the turn;
* while a prompt is shown, whatever is written to stdout or stderr is printed *above* it
  (:class:`Above`), whole lines only, and the terminal stays in the prompt's mode meanwhile
  (a key typed then is the prompt's, never echoed into the output); while a turn runs, the
  line the model is still writing is shown on its own line above the input
  (:class:`ChatStdout`), and the status line is the prompt's bottom toolbar
  (:class:`ToolbarStatus`);
* a plugin that asks on the terminal (:func:`dsh.cli.status.status_paused`: dsh-shell's
  approval question, ``ask_user``) pauses every status line before it writes its question;
  the toolbar's pause closes the typing prompt first and waits until it has let go of the
  terminal, so the answer goes to the question and never to the prompt.

Imported only by ``dsh chat`` on a terminal: ``dsh run`` and ``dsh --help`` never load
prompt_toolkit (tests/test_hot_path.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.key_binding import KeyBindings

from dsh.cli.chat_completion import ChatCompleter
from dsh.cli.chat_history import LineHistory
from dsh.cli.status import StatusLine
from dsh.cli.status import asking
from dsh.cli.streams import Stdout

if TYPE_CHECKING:
    from dsh.cli.repl import Chat

#: What an interrupted prompt returns (a pause, or the end of the turn), never a message.
_STOPPED = object()
#: The prompt while the agent works: what is typed there steers the turn.
TURN_PROMPT = "↳ "


class _Job:
    """Text to print above a prompt, printed once: by the prompt's loop, or by the writer
    itself once that loop has ended."""

    def __init__(self, real: Any, text: str) -> None:
        self.real = real
        self.text = text
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._taken = False

    def claim(self) -> bool:
        with self._lock:
            taken, self._taken = self._taken, True
            return not taken

    def write(self) -> None:
        try:
            self.real.write(self.text)
            self.real.flush()
        except (OSError, ValueError):
            pass


class Above:
    """``sys.stdout`` or ``sys.stderr`` while the chat runs on a terminal: text goes to the
    real stream (``real``) at once when no prompt is shown, else whole lines are printed above
    the prompt, synchronously (the writer returns once they are on the screen: a question
    written to the terminal next comes after them); an unfinished line waits for its end."""

    def __init__(self, term: ChatTerminal, real: Any) -> None:
        self.term = term
        self.real = real
        self._buffer = ""
        self._lock = threading.RLock()

    def write(self, text: str) -> int:
        with self._lock:  # not held while printing: the prompt's loop may write too
            whole, nl, self._buffer = (self._buffer + text).rpartition("\n")
        if nl:
            self.term.print_above(self.real, whole + nl)
        return len(text)

    def flush(self) -> None:
        text = ""
        with self._lock:
            if self._buffer and not self.term.prompting():
                text, self._buffer = self._buffer, ""
        if text:
            self.term.print_above(self.real, text)
        try:
            self.real.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return bool(self.real.isatty())

    def fileno(self) -> int:
        return int(self.real.fileno())

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer…
        return getattr(self.real, name)


class ChatStdout(Stdout):
    """The chat's stdout. While a turn runs (:attr:`holding`), whole lines go above the
    prompt and the line still being written is kept in :attr:`partial`, which the typing
    prompt shows on its own line above the input; otherwise text goes out as it comes."""

    def __init__(self, term: ChatTerminal) -> None:
        super().__init__()
        self.term = term
        self.holding = False
        self.partial = ""

    def write(self, text: str) -> None:
        if not self.holding:
            text, self.partial = self.partial + text, ""
            if text:
                super().write(text)
            return
        text = self.partial + text
        done, nl, self.partial = text.rpartition("\n")
        if nl:
            super().write(done + nl)
        self.term.refresh()

    def release(self) -> None:
        """The turn ended: what is kept is written as it is (the answer's last newline
        follows)."""
        self.holding = False
        self.write("")


class ToolbarStatus(StatusLine):
    """The status line of a turn, shown as the typing prompt's bottom toolbar instead of
    being drawn on stderr; its notes are lines printed above the prompt. Pausing it (a
    plugin asks on the terminal) closes the typing prompt first (:meth:`Typing.pause`)."""

    def __init__(self, term: ChatTerminal) -> None:
        import sys

        super().__init__(sys.stderr, color=False)
        self.term = term

    def start(self) -> None:  # drawn by the prompt, not by a thread
        pass

    def _write(self, text: str) -> None:
        pass

    def pause(self) -> None:
        typing = self.term.typing
        if typing is not None:
            typing.pause()

    def note(self, message: str, *, styled: bool = False) -> None:
        import sys

        from dsh.cli.escape import escape_controls

        try:
            sys.stderr.write((message if styled else escape_controls(message)) + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


class Typing:
    """The prompt while a turn runs, in a thread: each accepted line goes to ``on_line``
    (:meth:`dsh.cli.repl.Chat.typed_during_turn`). It steps aside while a plugin asks on the
    terminal (:meth:`pause`, synchronous) and comes back with what was typed so far. Ctrl-C
    is the turn's interrupt, as on a terminal in cooked mode (SIGINT to this process)."""

    def __init__(self, term: ChatTerminal, on_line: Callable[[str], None], text: str) -> None:
        self.term = term
        self.on_line = on_line
        self.text = text
        self._lock = threading.Lock()
        self._app: Any = None
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="dsh-typing", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> str:
        """End the prompt (the turn ended); return what was typed on an unfinished line."""
        self._stop.set()
        self._close()
        self._thread.join(10)
        return self.text

    def pause(self) -> None:
        """Close the prompt now and wait until it has let go of the terminal; it comes back
        by itself once no one asks any more (:func:`dsh.cli.status.asking`)."""
        self._close()

    def _close(self) -> None:
        import time

        deadline = time.monotonic() + 10
        while not self._idle.wait(0.01):
            with self._lock:
                app = self._app
            if app is None:
                if time.monotonic() > deadline:  # never started (no pre_run): give up
                    return
                continue  # starting: it sees the pause (or the stop) in pre_run
            done = threading.Event()

            def leave(app: Any = app, done: threading.Event = done) -> None:
                if app.is_running and app.future is not None and not app.future.done():
                    self.text = app.current_buffer.text
                    app.exit(result=_STOPPED)
                done.set()

            try:
                app.loop.call_soon_threadsafe(leave)
            except (AttributeError, RuntimeError):  # its loop is closed: it is ending
                pass
            done.wait(5)
            self._idle.wait(10)
            return

    def _started(self) -> None:
        app: Any = self.term.typing_session.app
        with self._lock:
            if self._stop.is_set() or asking():
                app.exit(result=_STOPPED)
                return
            self._app = app

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if asking():
                    wait = True
                else:
                    wait = False
                    self._idle.clear()
            if wait:
                self._stop.wait(0.05)
                continue
            try:
                text, self.text = self.text, ""
                got = self.term.run_prompt(self.term.typing_session, self.term.typing_message,
                                           text, self._started)
            except EOFError:  # Ctrl-D while the agent works: nothing to leave yet
                got = None
            except Exception:  # noqa: BLE001 - the terminal went away: the turn goes on
                got = None
                self._stop.set()
            finally:
                with self._lock:
                    self._app = None
                    self._idle.set()
            if isinstance(got, str):
                self.on_line(got)


class ChatTerminal:
    """The prompts of one ``dsh chat`` on a terminal, and what they share: the history, the
    completer, the turn's partial line and status."""

    def __init__(self, chat: Chat, history: Path) -> None:
        import sys

        from prompt_toolkit.output import create_output

        self.chat = chat
        self.history = LineHistory(history, chat.note)
        self.completer = ChatCompleter(chat)
        self.stdout = ChatStdout(self)
        self.status: ToolbarStatus | None = None
        self.typing: Typing | None = None
        self._prefill = ""
        self.real = (sys.stdout, sys.stderr)
        output = create_output(stdout=sys.stdout, always_prefer_tty=True)
        self.session: PromptSession[str] = PromptSession(
            history=self.history, completer=self.completer, complete_while_typing=False,
            key_bindings=self._keys(turn=False), reserve_space_for_menu=4, output=output)
        self.typing_session: PromptSession[str] = PromptSession(
            history=self.history, completer=self.completer, complete_while_typing=False,
            key_bindings=self._keys(turn=True), erase_when_done=True, output=output,
            bottom_toolbar=self._toolbar, refresh_interval=0.2, reserve_space_for_menu=4)
        #: The prompt shown now (its app, loop, thread, and an event set once it returned).
        self._print_lock = threading.Lock()
        self._active: tuple[Any, Any, int, threading.Event] | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """``sys.stdout`` and ``sys.stderr`` print above the prompt meanwhile (:class:`Above`)."""
        import sys

        out, err = self.real
        sys.stdout, sys.stderr = Above(self, out), Above(self, err)
        try:
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                if isinstance(stream, Above) and stream._buffer:
                    stream.real.write(stream._buffer)
            sys.stdout, sys.stderr = out, err

    def prompting(self) -> bool:
        return self._active is not None

    def run_prompt(self, session: PromptSession[str], message: Any, default: str,
                   pre_run: Callable[[], None] | None = None) -> Any:
        """``session.prompt``, known as the prompt shown meanwhile (:meth:`print_above`)."""
        gone = threading.Event()

        def started() -> None:
            app = session.app
            with self._print_lock:
                self._active = (app, app.loop, threading.get_ident(), gone)
            if pre_run is not None:
                pre_run()

        try:
            return session.prompt(message, default=default, pre_run=started)
        finally:
            gone.set()  # its loop runs nothing more: a writer waiting on it writes itself
            with self._print_lock:
                if self._active is not None and self._active[3] is gone:
                    self._active = None

    def print_above(self, real: Any, text: str) -> None:
        """Write ``text`` to ``real``: above the prompt if one is shown (in the prompt's loop:
        erase it, write, draw it again below), else at once."""
        with self._print_lock:
            active = self._active
        job = _Job(real, text)
        if active is None:
            job.write()
            return
        app, loop, ident, gone = active
        if threading.get_ident() == ident:  # from the prompt's own loop
            self._draw(app, job)
            return
        try:
            loop.call_soon_threadsafe(self._draw, app, job)
        except RuntimeError:  # its loop is closed
            gone.set()
        while not job.done.wait(0.01):
            if gone.is_set():
                if job.claim():
                    job.write()
                    job.done.set()
                else:
                    job.done.wait(5)
                return

    @staticmethod
    def _draw(app: Any, job: _Job) -> None:
        if not job.claim():
            return
        try:
            running = app.is_running and app.future is not None and not app.future.done()
            if running:
                app.renderer.erase()
            job.write()
            if running:
                app.invalidate()
        finally:
            job.done.set()

    def _keys(self, *, turn: bool) -> KeyBindings:
        keys = KeyBindings()

        @keys.add("escape", "enter")
        def _newline(event: Any) -> None:
            event.current_buffer.insert_text("\n")

        if turn:
            @keys.add("c-c")
            def _interrupt(event: Any) -> None:
                os.kill(os.getpid(), signal.SIGINT)  # the turn's Ctrl-C (Interrupt)

        return keys

    def read(self, prompt: str, default: str = "") -> str:
        """One line typed at the prompt between turns (KeyboardInterrupt on Ctrl-C, EOFError
        on Ctrl-D at an empty line)."""
        return str(self.run_prompt(self.session, prompt, default))

    def typing_message(self) -> str:
        partial = self.stdout.partial
        return f"{partial}\n{TURN_PROMPT}" if partial else TURN_PROMPT

    def _toolbar(self) -> Any:
        status = self.status
        if status is None:
            return None
        return " " + status.line()

    def refresh(self) -> None:
        typing = self.typing
        app = typing._app if typing is not None else None
        if app is not None:
            try:
                app.invalidate()
            except RuntimeError:
                pass

    def begin_turn(self, output: Any, on_line: Callable[[str], None], text: str) -> None:
        """The turn's output printed above a typing prompt (which starts with ``text``)."""
        status = ToolbarStatus(self)
        old = output.status
        output.status = status
        output._handlers = [status.on_event if old is not None and h == old.on_event else h
                            for h in output._handlers]
        if old is None:
            output._handlers.append(status.on_event)
        if output.printer is not None:
            output.printer.hide_status, output.printer.show_status = status.hide, status.show
        self.status = status
        self.stdout.holding = True
        from prompt_toolkit.utils import is_dumb_terminal

        if is_dumb_terminal():  # no screen to draw on: lines typed now wait for the prompt
            self._prefill = text
            return
        self.typing = Typing(self, on_line, text)
        self.typing.start()

    def end_turn(self) -> str:
        """Close the typing prompt; what was typed on it, for the next prompt."""
        typing, self.typing = self.typing, None
        text = typing.stop() if typing is not None else self._prefill
        self._prefill = ""
        self.status = None
        self.stdout.release()
        return text
