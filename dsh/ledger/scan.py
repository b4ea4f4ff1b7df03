"""Reading ledger files: every line checked, at C speed when all is well.

:func:`read_ledger_file` reads only a regular file (a FIFO, a directory or an unreadable file
named ``*.jsonl`` is an error naming it, never a hang). :func:`parse_line` checks one line
strictly — JSON object, not nested too deeply, no lone surrogate, ``seq`` the previous line's
plus one from 0, ``ts`` and ``session`` — and says what is wrong at ``PATH:LINE``.
:func:`scan` feeds a file's events to a sink without keeping them: decoded about a MiB at a
time when every line is well formed (:func:`_scan_fast`), else line by line, so a torn last
line is reported and an earlier corrupt one is an error naming its line. ``_turn_starts``
finds the ``turn/start`` lines without parsing (``dsh sessions list``).
"""

from __future__ import annotations

import gc
import json
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsh.core.errors import LedgerError
from dsh.core.errors import UsageError
from dsh.core.files import NotRegular
from dsh.core.files import kind_of
from dsh.core.files import read_regular
from dsh.core.files import reason as _reason
from dsh.ledger.events import Event
from dsh.ledger.serialize import EventCodec
from dsh.ledger.serialize import InvalidLine

Sink = Callable[[Event], None]


def read_lines(path: Path, codec: EventCodec) -> tuple[list[Event], int, int]:
    """Parse a ledger file: ``(events, good_bytes, torn_bytes)``.

    Only the last line may be torn (no newline, or unparseable): it is left out and its size
    returned. Any earlier bad line raises :class:`LedgerError` naming the file and line.
    """
    events: list[Event] = []

    def fresh() -> Sink:
        events.clear()
        return events.append

    good, torn = scan(path, codec, fresh)
    return events, good, torn


def read_ledger_file(path: Path) -> bytes:
    """The bytes of a ledger file. Only a regular file is read: a FIFO (opened without
    blocking), a directory or a device named ``*.jsonl`` is a :class:`LedgerError` naming it,
    and so is a file this user may not read."""
    try:
        return read_regular(path)
    except FileNotFoundError:
        raise UsageError(f"no session ledger at {path}") from None
    except NotRegular as exc:
        raise LedgerError(f"{path} is {exc.kind}, not a session ledger file") from None
    except OSError as exc:
        raise LedgerError(f"cannot read session ledger {path}: {_reason(exc)}") from None


def _check_regular(fd: int, path: Path) -> None:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        raise LedgerError(f"{path} is {kind_of(mode)}, not a session ledger file")


#: ``\uD800``–``\uDFFF`` escapes in a line: it may hold a lone surrogate (checked slowly).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def parse_line(line: bytes, codec: EventCodec, where: str, expected: int) -> Event:
    """One ledger line, checked strictly: an event whose ``seq`` is ``expected``, with ``ts``
    and ``session``, and no text that cannot be written back. Anything else is a
    :class:`LedgerError` saying what is wrong at ``where`` (``PATH:LINE``)."""
    try:
        d = json.loads(line)
    except RecursionError:
        raise LedgerError(f"{where}: nested too deeply to read") from None
    except ValueError as exc:
        raise LedgerError(f"{where}: not JSON ({exc})") from None
    if not isinstance(d, dict):
        raise LedgerError(f"{where}: a ledger line must be a JSON object")
    if _SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(d, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise LedgerError(f"{where}: holds a lone surrogate (text that is not valid "
                              "Unicode; dsh never writes one)") from None
        except RecursionError:  # pragma: no cover - loads would have failed first
            raise LedgerError(f"{where}: nested too deeply to read") from None
    seq = d.get("seq")
    if type(seq) is not int:
        raise LedgerError(f"{where}: no 'seq' number")
    if seq != expected:
        raise LedgerError(f"{where}: 'seq' is {seq} where {expected} was expected "
                          "(a line is missing, repeated or out of order)")
    for key in ("ts", "session"):
        if type(d.get(key)) is not str:
            raise LedgerError(f"{where}: no {key!r} string")
    try:
        return codec.from_dict(d, where)
    except RecursionError:  # JSON that loads but is too deep to become an event
        raise LedgerError(f"{where}: nested too deeply to read") from None


def scan(path: Path, codec: EventCodec, fresh: Callable[[], Sink],
         raw: Callable[[], Callable[[dict[str, Any], str], None]] | None = None) -> tuple[int, int]:
    """Feed every event of the file to a sink without keeping them; ``(good, torn)`` bytes.

    ``fresh()`` returns the sink; it is called again (and must start over) if the fast path
    gives up half way and the file is walked line by line instead. With ``raw``, the fast path
    feeds the decoded JSON objects, each with its line's text, to ``raw()`` instead of building
    events (``sink(d, line)``: a consumer that checks what it reads, like
    :meth:`Projection.apply_raw`).
    """
    data = read_ledger_file(path)
    # A read builds objects by the hundred thousand and frees none: the cyclic collector's
    # passes over them were 40% of reading a 100k-event ledger. Paused for the fast path only
    # (bounded: one file's objects); what it would have found is collected after.
    paused = gc.isenabled()
    gc.disable()
    try:
        fast = _scan_fast(data, codec, raw() if raw is not None else fresh(), raw is not None)
    finally:
        if paused:
            gc.enable()
    if fast is not None:
        return fast
    sink = fresh()
    pos = 0
    lineno = 0
    size = len(data)
    expected = 0
    while pos < size:
        end = data.find(b"\n", pos)
        lineno += 1
        if end == -1:  # torn tail: no newline was ever written after it
            return pos, size - pos
        line = data[pos:end]
        if line.strip():
            try:
                event = parse_line(line, codec, f"{path}:{lineno}", expected)
            except LedgerError:
                if end + 1 >= size:  # a complete but garbled last line is a torn tail too
                    return pos, size - pos
                raise
            sink(event)
            expected += 1
        pos = end + 1
    return size, 0


_CHUNK = 1 << 20

#: The decoder's own scanner: one JSON value at an offset of a str, and where it ends.
_SCAN_ONCE: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _scan_fast(data: bytes, codec: EventCodec, sink: Callable[..., None],
               raw: bool = False) -> tuple[int, int] | None:
    """The common case at C speed: every complete line valid, at most a torn tail without a
    newline. Decodes about a MiB of lines at a time as text and each line as one JSON value
    that must end exactly at its newline (so no value is read across a line break: what a
    line holds here is what it holds alone, in :func:`parse_line`), and checks that each is
    an object with consecutive ``seq`` from 0, ``ts`` and ``session``; anything unusual (a
    surrogate escape, whitespace around a value, an empty line) returns ``None`` so that
    :func:`scan` walks the lines one by one and reports exactly what is wrong where. With
    ``raw``, the sink gets each object and the line's text (``sink(d, line)``)."""
    good = data.rfind(b"\n") + 1
    if _SURROGATE_ESCAPE.search(data, 0, good):
        return None
    scan_once = _SCAN_ONCE
    pos = 0
    expected = 0
    while pos < good:
        end = data.find(b"\n", min(pos + _CHUNK, good - 1)) + 1
        try:
            text = data[pos:end].decode()
        except UnicodeDecodeError:
            return None
        i = 0
        size = len(text)
        while i < size:
            try:
                d, j = scan_once(text, i)
                if text[j] != "\n":  # a value ends at its line's end, nothing after it
                    return None
            except (StopIteration, ValueError, RecursionError, IndexError):
                return None  # no value here (blank line, whitespace), not JSON, too deep
            if type(d) is not dict:
                return None
            seq = d.get("seq")
            if (type(seq) is not int or seq != expected or type(d.get("ts")) is not str
                    or type(d.get("session")) is not str):
                return None
            try:
                if raw:
                    sink(d, text[i:j])
                else:
                    sink(codec.from_dict(d))
            except (LedgerError, InvalidLine, KeyError, TypeError, RecursionError):
                return None
            expected += 1
            i = j + 1
        pos = end
    return good, len(data) - good


_TURN_TAG = b'"type":"turn/start"'
_TOP_LEVEL = re.compile(rb'\{(?:"v":\d+,)?\Z')


def _turn_starts(data: bytes) -> list[int]:
    """Offsets of the ``turn/start`` lines of a ledger, without parsing it: the tag counts
    only where it is the line's first key (after ``v``); the same bytes inside a tool's
    arguments do not. O(number of occurrences)."""
    out = []
    pos = data.find(_TURN_TAG)
    while pos != -1:
        start = data.rfind(b"\n", 0, pos) + 1
        if _TOP_LEVEL.match(data, start, pos):
            out.append(start)
        pos = data.find(_TURN_TAG, pos + len(_TURN_TAG))
    return out

