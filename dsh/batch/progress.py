"""A batch at the terminal: the progress line and summary on stderr, and the signals.

:class:`Progress` keeps the counts, draws the progress line (on a terminal's stderr only) and
writes notes and the final summary; :class:`Signals` turns SIGINT into "start no more tasks"
(twice, or SIGTERM/SIGHUP: abort the running ones), with a grace period before the process
ends regardless.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from dsh.batch.runner import Batch
    from dsh.host.runcontext import Budget

class Progress:
    """Counts, the progress line (stderr on a terminal only) and the summary line."""

    def __init__(self, total: int, skipped: int, budget: Budget, stream: Any = None) -> None:
        self.total = total
        self.skipped = skipped
        self.done = 0
        self.failed = 0
        self.running = 0
        self.budget = budget
        self.started = time.monotonic()
        self.stream = stream if stream is not None else sys.stderr
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            tty = False
        if tty:
            self._thread = threading.Thread(target=self._draw_loop, daemon=True,
                                            name="dsh-batch-progress")
            self._thread.start()

    def change(self, *, running: int = 0, done: int = 0, failed: int = 0) -> None:
        with self._lock:
            self.running += running
            self.done += done
            self.failed += failed

    @property
    def left(self) -> int:
        return self.total - self.skipped - self.done - self.failed - self.running

    def tokens(self) -> str:
        b = self.budget
        text = f"{b.input_tokens + b.output_tokens:,} tokens"
        return text + (f", cost {b.cost:.4f}" if b.cost else "")

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        finished = self.done + self.failed
        rate = finished / elapsed
        eta = f"ETA {(self.left + self.running) / rate:.0f}s" if rate > 0 else "ETA -"
        return (f"batch: {self.done + self.skipped}/{self.total} done · {self.failed} failed · "
                f"{self.running} running · {self.left} left · {rate:.1f}/s · {eta} · "
                f"{self.tokens()}")

    def _draw_loop(self) -> None:
        while not self._stop.wait(0.25):
            self._draw()

    def _draw(self) -> None:
        try:
            self.stream.write("\r\x1b[2K" + self.line())
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def note(self, message: str) -> None:
        from dsh.core.sanitize import one_line

        message = one_line(message)  # a task's error text cannot forge a line of its own
        try:
            clear = "\r\x1b[2K" if self._thread is not None else ""
            self.stream.write(f"{clear}dsh: {message}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            try:
                self.stream.write("\r\x1b[2K")
            except (OSError, ValueError):
                pass
            self._thread = None


class Signals:
    """SIGINT once: stop starting tasks, running ones stop after their step; twice (or
    SIGTERM/SIGHUP): abort the running ones. The process ends at once if they do not end
    within :attr:`grace` seconds of the abort."""

    grace = 10.0

    def __init__(self, batch: Batch, note: Callable[[str], None]) -> None:
        self.batch = batch
        self.note = note
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self._old[signal.SIGINT] = signal.signal(signal.SIGINT, self._int)
            for signum in (signal.SIGTERM, signal.SIGHUP):
                self._old[signum] = signal.signal(signum, self._term)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, old in self._old.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)

    def _int(self, signum: int, frame: Any) -> None:
        self.batch.interrupts += 1
        if self.batch.interrupts == 1:
            self.batch.stop("interrupted")
            self.note("stopping: no new tasks, running ones end after their step "
                      "(Ctrl-C again to abort)")
        else:
            self._abort("interrupted")

    def _term(self, signum: int, frame: Any) -> None:
        self.batch.interrupts += 1
        self._abort(f"terminated by {signal.Signals(signum).name}")

    def _abort(self, reason: str) -> None:
        if self.batch.cancel.cancelled:
            return
        self.batch.abort(reason)
        timer = threading.Timer(self.grace, os._exit, (130,))
        timer.daemon = True
        timer.start()
