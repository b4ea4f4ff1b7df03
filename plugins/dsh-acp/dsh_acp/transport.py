"""The protocol's own file descriptors, and a JSON-RPC transport over them that a hostile or
broken client cannot crash.

:func:`claim_stdio` moves the protocol off file descriptors 0 and 1 before anything else runs:
fd 1 then points at stderr (a plugin's ``print`` or a tool's child cannot write into the
protocol stream) and fd 0 at ``/dev/null`` (a child cannot read the editor's messages).

:class:`LineTransport` is an :class:`acp` message transport (``send`` / ``receive`` /
``close``) reading newline-delimited JSON with a cap on the line's size: a line over the cap is
dropped and answered with a JSON-RPC ``Invalid Request`` error, a line that is not JSON with a
``Parse error``, a JSON value that is not an object with ``Invalid Request``; none of them
ends the connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import sys
import threading
from typing import Any

PARSE_ERROR = -32700
#: Seconds the requests still open at the end of input have to be answered.
DRAIN = 30.0
INVALID_REQUEST = -32600


def claim_stdio() -> tuple[int, int]:
    """``(protocol_in, protocol_out)``: private copies of fds 0 and 1; fd 1 becomes stderr
    and fd 0 ``/dev/null``."""
    sys.stdout.flush()
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return proto_in, proto_out


def _error(code: int, message: str, id_: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}


class LineTransport:
    """Newline-delimited JSON-RPC over two file descriptors, each message at most
    ``max_line`` bytes."""

    def __init__(self, fd_in: int, fd_out: int, max_line: int) -> None:
        self.fd_in = fd_in
        self.fd_out = fd_out
        self.max_line = max_line
        self._reader: asyncio.StreamReader | None = None
        self._writer: threading.Thread | None = None
        self._out: queue.SimpleQueue[tuple[bytes, asyncio.Future[None]]] = queue.SimpleQueue()
        #: Requests received and not yet answered; at the end of input they are answered
        #: (``on_eof`` aborts the turns first) before the connection ends.
        self._open: set[Any] = set()
        self._drained = asyncio.Event()
        self.on_eof: Any = None
        self._closed = False

    async def start(self) -> None:
        """Threads do the blocking reads and writes: the protocol's fds may be pipes,
        sockets, files or terminals, and a client that stops reading never blocks the loop."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=self.max_line)
        self._reader = reader

        def pump() -> None:
            try:
                while True:
                    try:
                        data = os.read(self.fd_in, 1 << 16)
                    except InterruptedError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        break
                    loop.call_soon_threadsafe(reader.feed_data, data)
            except RuntimeError:  # the loop is gone
                return
            try:
                loop.call_soon_threadsafe(reader.feed_eof)
            except RuntimeError:
                pass

        threading.Thread(target=pump, name="dsh-acp-stdin", daemon=True).start()

    async def send(self, message: dict[str, Any]) -> None:
        if self._closed:
            raise ConnectionError("the editor's connection is closed")
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_all, args=(loop,),
                                            name="dsh-acp-stdout", daemon=True)
            self._writer.start()
        self._out.put((data + b"\n", done))  # one thread writes: in the order sent
        try:
            await done
        finally:
            if "method" not in message and "id" in message:  # a response: that one is answered
                self._open.discard(_key(message["id"]))
                if not self._open:
                    self._drained.set()

    def _write_all(self, loop: asyncio.AbstractEventLoop) -> None:
        """The writer thread (a daemon: a client that never reads cannot keep dsh alive)."""
        while True:
            data, done = self._out.get()
            error: BaseException | None = None
            view = memoryview(data)
            while view and error is None:
                try:
                    view = view[os.write(self.fd_out, view):]
                except InterruptedError:
                    continue
                except OSError as exc:
                    self._closed = True
                    error = ConnectionError(f"cannot write to the editor: {exc}")
            try:
                loop.call_soon_threadsafe(_settle, done, error)
            except RuntimeError:
                return

    async def _complain(self, code: int, message: str) -> None:
        _note(message)
        try:
            await self.send(_error(code, message))
        except (ConnectionError, OSError):
            pass

    async def receive(self) -> dict[str, Any] | None:
        assert self._reader is not None
        while True:
            line, too_long = await self._line()
            if line is None:
                await self._end()
                return None
            if too_long:
                await self._complain(INVALID_REQUEST, f"message longer than {self.max_line} "
                                                      "bytes dropped")
                continue
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except (ValueError, UnicodeDecodeError) as exc:
                await self._complain(PARSE_ERROR, f"parse error: {exc}"[:300])
                continue
            if not isinstance(message, dict):
                await self._complain(INVALID_REQUEST, "a JSON-RPC message must be an object")
                continue
            method = message.get("method")
            if method is not None and not isinstance(method, str):
                if "id" in message:
                    await self.send(_error(INVALID_REQUEST, "method must be a string",
                                           _plain_id(message.get("id"))))
                continue
            if "id" in message and not _valid_id(message["id"]):
                await self._complain(INVALID_REQUEST, "id must be a string, a number or null")
                continue
            if method is None and "id" in message and not (
                    "result" in message or "error" in message):
                continue  # neither a request nor a response
            if method is not None and "id" in message:
                self._open.add(_key(message["id"]))
                self._drained.clear()
            return message

    async def _end(self) -> None:
        """The end of input: the editor has gone (or half-closed). The running turns are
        aborted (``on_eof``) and every request received gets its answer, for at most
        :data:`DRAIN` seconds, before the connection ends."""
        if self.on_eof is not None:
            self.on_eof()
        if self._open and not self._closed:
            try:
                await asyncio.wait_for(self._drained.wait(), DRAIN)
            except TimeoutError:
                pass

    async def _line(self) -> tuple[bytes | None, bool]:
        """The next line (``None`` at the end of input), and whether it was over the cap
        (then it was read and dropped: the line is empty)."""
        assert self._reader is not None
        dropped = False
        while True:
            try:
                line = await self._reader.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                if dropped:
                    return b"", True
                return exc.partial or None, False
            except asyncio.LimitOverrunError as exc:
                await self._reader.readexactly(exc.consumed)  # dropped, never kept
                dropped = True
                continue
            except (ConnectionError, OSError):
                return None, False
            if dropped or len(line) > self.max_line:
                return b"", True
            return line, False

    def stop(self) -> None:
        """End the input now (SIGTERM): as if the editor had closed it."""
        if self._reader is not None and not self._reader.at_eof():
            self._reader.feed_eof()

    async def close(self) -> None:
        self._closed = True


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)


def _key(value: Any) -> Any:
    return (type(value).__name__, value)


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool))


def _plain_id(value: Any) -> Any:
    return value if _valid_id(value) else None


def _note(text: str) -> None:
    from dsh.core.escape import escape_controls

    sys.stderr.write(f"dsh: acp: {escape_controls(text, newlines=False)}\n")
    sys.stderr.flush()
