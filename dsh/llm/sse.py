"""An incremental Server-Sent Events parser, independent of any HTTP library.

Feed it the raw bytes of a ``text/event-stream`` body in whatever pieces the network delivers;
it returns the events completed so far. The result does not depend on where the byte stream
was split: lines are cut on bytes (``\\n``, ``\\r\\n`` or ``\\r``) *before* decoding, and UTF-8
never uses bytes below 0x80 inside a multi-byte character, so a character split across two
chunks is always decoded whole. A ``\\r`` ending one chunk is remembered so that a ``\\n``
starting the next is not taken for a second, empty line.

Parsing follows the WHATWG "event stream interpretation" rules, with one leniency: :meth:`flush`
dispatches an event whose blank line never came (the spec drops it). The adapters check for
their own end-of-stream marker, so a truncated stream is still detected.
"""

from __future__ import annotations

import re

import attrs

_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = "\ufeff"


@attrs.frozen
class SSEEvent:
    """One dispatched event. ``event`` defaults to ``"message"`` as in the spec; ``id`` is the
    last event id seen in the stream (it persists across events); ``retry`` is the reconnection
    time in milliseconds when the event's block carried a valid ``retry:`` field."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEParser:
    """Incremental SSE parser: ``feed(bytes) -> list[SSEEvent]``, then ``flush()`` at the end."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf already known to hold no line ending
        self._skip_lf = False  # the previous chunk ended with "\r": drop a leading "\n"
        self._first_line = True
        self._data: list[str] = []
        self._event = ""
        self._retry: int | None = None
        self._last_id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk``; return the events it completed (possibly none)."""
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        buf = self._buf
        buf += chunk
        events: list[SSEEvent] = []
        start = 0
        pos = self._scanned
        while True:
            m = _LINE_END.search(buf, pos)
            if m is None:
                break
            end = m.end()
            if end == len(buf) and buf[m.start()] == 0x0D and m.end() - m.start() == 1:
                # A lone "\r" at the end of what we have: the "\n" may follow in the next chunk.
                self._skip_lf = True
            self._line(bytes(buf[start : m.start()]), events)
            start = pos = end
        del buf[:start]
        self._scanned = len(buf)
        return events

    def flush(self) -> list[SSEEvent]:
        """End of stream: process a last unterminated line and dispatch a pending event."""
        events: list[SSEEvent] = []
        if self._buf:
            self._line(bytes(self._buf), events)
            self._buf.clear()
            self._scanned = 0
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        line = raw.decode("utf-8", errors="replace")
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            self._dispatch(events)
            return
        if line[0] == ":":
            return  # comment (servers send these as keep-alives)
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self._last_id = value
        elif field == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)
        # any other field is ignored, as the spec says

    def _dispatch(self, events: list[SSEEvent]) -> None:
        if self._data:
            events.append(
                SSEEvent(
                    data="\n".join(self._data),
                    event=self._event or "message",
                    id=self._last_id,
                    retry=self._retry,
                )
            )
        self._data = []
        self._event = ""
        self._retry = None
