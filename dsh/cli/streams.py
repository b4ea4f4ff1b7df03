"""Where a run's text goes: :class:`Stdout` (stdout that survives a closed pipe or a full
disk, and writes lone surrogates as U+FFFD), :func:`silence_stdout` (file descriptor 1 pointed
at ``/dev/null`` once the reader went away), and the printers of streamed text:
:class:`TextPrinter` (the answer, a newline between steps) and :class:`ReasoningPrinter`
(``--show-reasoning``: whole words, so a secret split across deltas is still redacted).

Imports only the standard library at import time.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from typing import Any


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
