"""What starting a stdio server does to dsh's own process, and what the SDK writes to it:

- :func:`harden` makes dsh non-dumpable before the first server starts, as dsh-shell and
  dsh-hooks do before their first command (a server running as the user cannot read
  ``/proc/<dsh>/environ`` or ``mem``: the keys dsh holds);
- :class:`StderrTail` takes a server's stderr through a pipe that the event loop drains into
  a bounded buffer (the last :data:`STDERR_KEEP` bytes), never a file that grows without end;
- :func:`escape_sdk_logging` makes every record the ``mcp`` SDK (and ``httpx``) logs safe for
  a terminal (control characters made visible, secrets redacted): an SSE event name, a
  content type or an exception message from a server can hold terminal escapes.
"""

from __future__ import annotations

import asyncio
import logging
import os

#: Bytes of a server's stderr kept (its end): enough for the tail an error line quotes.
STDERR_KEEP = 16 * 1024
_CHUNK = 65536


def harden() -> str:
    """``prctl(PR_SET_DUMPABLE, 0)`` once (:func:`dsh.sandbox.environment.harden`, shared with
    every confined process of dsh); ``""`` when done, else why not."""
    from dsh.sandbox.environment import harden as harden_once

    return harden_once()


class StderrTail:
    """A pipe for one server's stderr. :attr:`writer` is what the SDK hands the process; the
    loop reads the other end as data arrives and keeps only the last :data:`STDERR_KEEP`
    bytes. Used on the pool's event loop thread only."""

    def __init__(self, loop: asyncio.AbstractEventLoop, keep: int = STDERR_KEEP) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        self._fd: int | None = read
        self._loop = loop
        self._keep = keep
        self._buf = bytearray()
        self.total = 0
        self.writer = os.fdopen(write, "w", encoding="utf-8", errors="replace")
        loop.add_reader(read, self._drain)

    def started(self) -> None:
        """The process has its copy of the write end: close dsh's, so that the pipe ends when
        the server (and its children) exit."""
        if not self.writer.closed:
            self.writer.close()

    def _drain(self) -> None:
        while self._fd is not None:
            try:
                data = os.read(self._fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._stop_reading()
                return
            self.total += len(data)
            self._buf += data
            if len(self._buf) > self._keep:
                del self._buf[:len(self._buf) - self._keep]

    def text(self) -> str:
        """What is kept of the server's stderr (read up to now)."""
        self._drain()
        return self._buf.decode("utf-8", "replace")

    def _stop_reading(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                self._loop.remove_reader(fd)
            except (RuntimeError, ValueError):  # the loop is already closed
                pass
            os.close(fd)

    def close(self) -> None:
        self.started()
        self._stop_reading()


def escape_sdk_logging() -> None:
    """Add :class:`_TerminalSafe` to every ``mcp``/``httpx``/``httpcore`` logger that exists
    (they are made when their modules are imported, so this is called after the SDK's
    transport modules are); idempotent."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if not isinstance(logger, logging.Logger) or name.split(".")[0] not in _LOGGERS:
            continue
        if not any(isinstance(f, _TerminalSafe) for f in logger.filters):
            logger.addFilter(_TerminalSafe())


_LOGGERS = ("mcp", "mcp_types", "httpx", "httpx2", "httpcore", "httpcore2")


class _TerminalSafe(logging.Filter):
    """A record's message (with its arguments and any traceback) redacted and with its control
    characters made visible (:func:`dsh.cli.render.escape_controls`), before any handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        from dsh.cli.render import escape_controls
        from dsh.core.redact import redact

        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logging's problem
            return True
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
            record.exc_info, record.exc_text = None, None
        clean = escape_controls(redact(message))
        if clean != message or record.args:
            record.msg, record.args = clean, ()
        return True
