"""The session ledger (MISSION A5, C1): one append-only JSON Lines file per session.

Durability rules (docs/architecture.md, "The ledger"):

* each event is written with a single ``write(2)`` on an ``O_APPEND`` descriptor, so a crash
  leaves at most one torn line, and only at the end;
* ``fsync`` at every step boundary by default (``fsync = "event" | "step" | "never"``);
* a new file is created ``0600`` and its directory is fsynced, so the file itself survives;
* the writing run holds an exclusive ``flock``: a second writer gets :class:`SessionInUse`;
* on open, a torn last line is reported and cut; every earlier line is kept. A corrupt line
  *before* the last is an error naming the file and line, never silently dropped. Corrupt
  means: not UTF-8 JSON, not an object, nested too deeply, holding a lone surrogate, a
  wrong field, ``seq`` out of sequence (each line's is the previous one's plus one, from 0),
  or ``ts``/``session`` missing;
* a tool call without a result, and a turn without an end, are closed on open (``interrupted``)
  so no provider ever sees a dangling call;
* text that cannot be written as UTF-8 (lone surrogates) is sanitised on the way in and the
  event says so (``"sanitized": N``, :mod:`dsh.sanitize`);
* a session that ends before its first event leaves no file behind; a ledger file deleted
  while it is being written is noticed at the next step boundary (:attr:`Ledger.lost`);
* only regular files are read: a FIFO, a directory or an unreadable file named ``*.jsonl``
  is an error naming it (``sessions`` lists the others and reports it), never a hang.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from typing import TypeVar

import attrs

from dsh.core.errors import LedgerError
from dsh.core.errors import SessionInUse
from dsh.core.errors import UsageError
from dsh.core.files import NotRegular
from dsh.core.files import kind_of
from dsh.core.files import read_regular
from dsh.core.files import reason as _reason
from dsh.core.sanitize import clean_value
from dsh.hookspecs import hookimpl
from dsh.ledger.events import Event
from dsh.ledger.events import StepEnded
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.history import Projection
from dsh.ledger.serialize import EventCodec
from dsh.ledger.serialize import InvalidLine
from dsh.ledger.serialize import default_codec
from dsh.ledger.serialize import dump_event

E = TypeVar("E", bound=Event)
FSYNC_POLICIES = ("event", "step", "never")
INTERRUPTED = "interrupted: the run ended before this tool returned"
#: The longest session id, in bytes: ``ID.jsonl`` must fit a file name (255 bytes).
MAX_ID_BYTES = 200


def new_session_id() -> str:
    """Sortable by creation time (to the millisecond), unique enough:
    ``20261130-142501.123-3f9a1c``."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"{stamp}.{int(now * 1000) % 1000:03d}-{os.urandom(3).hex()}"


_SECOND: list[Any] = [-1, ""]


def _now() -> str:
    """ISO-8601 UTC with milliseconds, ``2026-11-30T14:25:01.123Z``; the formatted second is
    reused while it lasts (every event of a step is stamped here)."""
    now = time.time()
    second = int(now)
    if second != _SECOND[0]:
        _SECOND[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))]
    return f"{_SECOND[1]}.{int((now - second) * 1000):03d}Z"


def sanitized(event: E) -> E:
    """``event`` with every lone surrogate in its text replaced (pairs joined first), and
    ``"sanitized": N`` — how many were replaced — added to its line (docs/events.md)."""
    fields = {}
    total = 0
    for f in attrs.fields(type(event)):
        if f.name in ("seq", "ts", "session", "extra"):
            continue
        old = getattr(event, f.name)
        value, n = clean_value(old)
        if value is not old:
            fields[f.name] = value
            total += n
    extra, n = clean_value(dict(event.extra))
    total += n
    if total:  # a joined pair alone is no replacement: nothing to say
        extra["sanitized"] = int(extra.get("sanitized") or 0) + total
    return attrs.evolve(event, **fields, extra=extra)


class MemoryBlobs:
    """The attachment store of an in-memory (``--no-save``) session: bytes by hash (issue
    17). Here rather than in :mod:`dsh.attachments` so that a run without attachments never
    imports that module."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def put_attachment(self, data: bytes) -> str:
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        self._blobs.setdefault(sha, bytes(data))
        return sha

    def get_attachment(self, sha256: str) -> bytes:
        try:
            return self._blobs[sha256]
        except KeyError:
            from dsh.ledger.blobs import AttachmentMissing

            raise AttachmentMissing(f"attachment {sha256[:12]} is not in memory") from None

    def attachment_path(self, sha256: str) -> str:
        return "(memory)"


class Ledger:
    """An open session: appends events, keeps the projection, holds the lock.

    ``path=None`` is an in-memory ledger (``--no-save``). ``observer`` is called with every
    event appended (live observation); it is ``None`` on unobserved runs.
    """

    def __init__(
        self,
        session_id: str,
        path: Path | None = None,
        *,
        fd: int | None = None,
        fsync: str = "step",
        projection: Projection | None = None,
        created: bool = False,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise UsageError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {fsync!r}")
        self.session_id = session_id
        self.path = path
        self._fd = fd
        self.fsync = fsync
        self.projection = projection or Projection()
        self.observer: Callable[[Event], None] | None = None
        #: What loading had to repair (torn tail, dangling calls), for the caller to report.
        self.notes: list[str] = []
        #: True when this object created the file: closing it empty removes it again.
        self._created = created
        #: Why the file can no longer be trusted to hold what was written (it was deleted
        #: during the run); set at the step boundary that noticed it.
        self.lost: str | None = None
        # One appender at a time: a plugin may record its own events from tool worker
        # threads (dsh.plugin_events). Re-entrant: an observer may append in turn.
        self._lock = threading.RLock()
        self._blobs: Any = None

    @property
    def blobs(self) -> Any:
        """Where this session's attachment bytes are kept (``put_attachment`` /
        ``get_attachment``, issue 17): the session store that opened it, or memory for an
        in-memory ledger; None for a store that keeps no attachments."""
        if self._blobs is None and self.path is None:
            self._blobs = MemoryBlobs()
        return self._blobs

    @blobs.setter
    def blobs(self, value: Any) -> None:
        self._blobs = value

    @property
    def closed(self) -> bool:
        return self._fd is None and self.path is not None

    def append(self, cls: type[E], **fields: Any) -> E:
        """Build, write and project one event; return it (sanitised, if it had to be).
        Thread-safe: each event gets the next ``seq`` and is written whole."""
        with self._lock:
            event = cls(seq=self.projection.seq + 1, ts=_now(), session=self.session_id,
                        **fields)
            return self._write(event)

    def _write(self, event: E) -> E:
        try:
            data = (dump_event(event) + "\n").encode()
        except UnicodeEncodeError:
            event = sanitized(event)
            data = (dump_event(event) + "\n").encode()
        if self._fd is not None:
            try:
                n = os.write(self._fd, data)
                if n != len(data):  # pragma: no cover - regular files do not short-write
                    raise OSError(f"short write ({n} of {len(data)} bytes)")
                if self.fsync == "event":
                    os.fsync(self._fd)
            except OSError as exc:
                raise LedgerError(f"cannot write session ledger {self.path}: "
                                  f"{_reason(exc)}") from exc
        elif self.path is not None:
            raise LedgerError(f"session {self.session_id} is closed")
        self.projection.apply(event)
        if self.observer is not None:
            self.observer(event)
        return event

    def step_boundary(self) -> None:
        """Make everything written so far durable, per the fsync policy, and check that the
        file is still there: a ledger deleted during the run (its folder removed) raises
        :class:`LedgerError` once and sets :attr:`lost`."""
        if self._fd is None:
            return
        if self.fsync != "never":
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise LedgerError(f"cannot write session ledger {self.path}: "
                                  f"{_reason(exc)}") from exc
        if self.lost is None and os.fstat(self._fd).st_nlink == 0:
            self.lost = (f"session ledger {self.path} was deleted during the run: "
                         "what this run did is not saved")
            raise LedgerError(self.lost)

    def close(self) -> None:
        if self._fd is not None:
            fd = self._fd
            try:
                if self._created and self.projection.seq < 0 and os.fstat(fd).st_size == 0:
                    # Nothing was ever written (a failure before the first event): a
                    # session without events is no session; do not leave an empty file.
                    with contextlib.suppress(OSError):
                        assert self.path is not None
                        self.path.unlink()
                    return
                if self.lost is None:
                    self.step_boundary()
            finally:
                os.close(fd)  # closing the descriptor releases the flock
                self._fd = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def recover(self) -> None:
        """Close what a crash left open: dangling tool calls get an ``interrupted`` result,
        an open step a ``step/end``, an open turn a ``turn/end`` with outcome ``aborted``."""
        p = self.projection
        if p.pending:
            dangling = list(p.pending.values())
            for call in dangling:
                self.append(
                    ToolReturned, call_id=call.id, name=call.name, status="interrupted",
                    output=INTERRUPTED,
                )
            self.notes.append(
                f"closed {len(dangling)} dangling tool call(s) as interrupted: "
                + ", ".join(c.name for c in dangling)
            )
        if p.step_open:
            self.append(StepEnded, turn=p.turn, step=p.step)
        if p.turn_open:
            self.append(
                TurnEnded, turn=p.turn, outcome="aborted",
                reason="interrupted: the process ended during this turn (closed on resume)",
            )
            self.notes.append(f"closed turn {p.turn}, interrupted by the end of a process")
        self.step_boundary()


@attrs.frozen
class SessionInfo:
    """A summary of one session for ``dsh sessions list``."""

    id: str
    path: Path
    agent: str = ""
    model: str = ""
    started: str = ""
    turns: int = 0
    first_prompt: str = ""
    parent: str | None = None


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
         raw: Callable[[], Callable[[dict[str, Any]], None]] | None = None) -> tuple[int, int]:
    """Feed every event of the file to a sink without keeping them; ``(good, torn)`` bytes.

    ``fresh()`` returns the sink; it is called again (and must start over) if the fast path
    gives up half way and the file is walked line by line instead. With ``raw``, the fast path
    feeds the decoded JSON objects to ``raw()`` instead of building events (a consumer that
    checks what it reads, like :meth:`Projection.apply_raw`).
    """
    data = read_ledger_file(path)
    fast = _scan_fast(data, codec, raw() if raw is not None else fresh(), raw is not None)
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


def _scan_fast(data: bytes, codec: EventCodec, sink: Callable[[Any], None],
               raw: bool = False) -> tuple[int, int] | None:
    """The common case at C speed: every complete line valid, at most a torn tail without a
    newline. Decodes about a MiB of lines at a time as one JSON array, and checks that it
    yields one object per line with consecutive ``seq`` from 0, ``ts`` and ``session``;
    anything unusual (a surrogate escape included) returns ``None`` so that :func:`scan`
    walks the lines one by one and reports exactly what is wrong where."""
    good = data.rfind(b"\n") + 1
    if _SURROGATE_ESCAPE.search(data, 0, good):
        return None
    pos = 0
    expected = 0
    while pos < good:
        end = data.find(b"\n", min(pos + _CHUNK, good - 1)) + 1
        try:
            lines = data[pos:end].decode().split("\n")[:-1]
            if not all(lines):
                return None
            objs = json.loads("[" + ",".join(lines) + "]")
        except (ValueError, RecursionError):  # not UTF-8, not JSON, or nested too deeply
            return None
        if len(objs) != len(lines):
            return None
        try:
            for d in objs:
                if type(d) is not dict:
                    return None
                seq = d.get("seq")
                if (type(seq) is not int or seq != expected or type(d.get("ts")) is not str
                        or type(d.get("session")) is not str):
                    return None
                item: Any = d if raw else codec.from_dict(d)
                expected += 1
                sink(item)
        except (LedgerError, InvalidLine, KeyError, TypeError, RecursionError):
            return None
        pos = end
    return good, len(data) - good


class JsonlStore:
    """The built-in session store: ``<dir>/<session>.jsonl``."""

    def __init__(self, directory: Path, *, fsync: str = "step", codec: EventCodec | None = None):
        self.directory = directory
        self.fsync = fsync
        self._codec = codec

    @property
    def codec(self) -> EventCodec:
        if self._codec is None:
            self._codec = default_codec()
        return self._codec

    def path(self, session_id: str) -> Path:
        """``<dir>/<session_id>.jsonl``; an id that could name another file is refused: empty,
        with ``/``, starting with ``.``, with a NUL or another control character, or longer
        than :data:`MAX_ID_BYTES`."""
        if (not session_id or "/" in session_id or session_id.startswith(".")
                or not session_id.isprintable()
                or len(session_id.encode("utf-8", "surrogateescape")) > MAX_ID_BYTES):
            shown = session_id if len(session_id) <= 80 else session_id[:77] + "..."
            raise UsageError(f"invalid session id {shown!r}")
        return self.directory / f"{session_id}.jsonl"

    def exists(self, session_id: str) -> bool:
        return self.path(session_id).exists()

    def create(self, session_id: str | None = None) -> Ledger:
        """Create a new session file (``0600``, directory fsynced) and lock it. An existing
        file is never overwritten (``O_EXCL``); a ledger closed before its first event
        removes its file again."""
        session_id = session_id or new_session_id()
        path = self.path(session_id)
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                         0o600)
        except FileExistsError:
            raise UsageError(f"session {session_id} already exists ({path})") from None
        except OSError as exc:
            raise LedgerError(f"cannot create session ledger {path}: {_reason(exc)}") from exc
        try:
            _lock(fd, session_id, path)
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                path.unlink()
            os.close(fd)
            if isinstance(exc, OSError):
                raise LedgerError(f"cannot create session ledger {path}: "
                                  f"{_reason(exc)}") from exc
            raise
        ledger = Ledger(session_id, path, fd=fd, fsync=self.fsync, created=True)
        ledger.blobs = self
        return ledger

    def open(self, session_id: str) -> Ledger:
        """Open an existing session for appending: lock, load, repair, project."""
        path = self.path(session_id)
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise UsageError(f"no session {session_id!r} (looked for {path})") from None
        except IsADirectoryError:
            raise LedgerError(f"{path} is a directory, not a session ledger file") from None
        except OSError as exc:
            raise LedgerError(f"cannot open session ledger {path} for writing: "
                              f"{_reason(exc)}{_owner_hint(path, exc)}") from None
        try:
            _check_regular(fd, path)
            _lock(fd, session_id, path)
            ledger = Ledger(session_id, path, fd=fd, fsync=self.fsync)
            ledger.blobs = self
            count = 0

            def fresh(raw: bool = False) -> Callable[[Any], None]:
                nonlocal count
                ledger.projection = Projection()
                count = 0
                apply = ledger.projection.apply_raw if raw else ledger.projection.apply

                def sink(item: Any) -> None:
                    nonlocal count
                    count += 1
                    apply(item)

                return sink

            # Lines are projected as they are parsed — straight from the JSON objects when
            # they are all well-formed — and never kept: resuming a long session costs the
            # projection's memory and time, not the events' (benchmarks/resume.py).
            good, torn = scan(path, self.codec, fresh, lambda: fresh(raw=True))
            if torn:
                try:
                    os.ftruncate(fd, good)
                    os.fsync(fd)
                except OSError as exc:
                    raise LedgerError(f"cannot repair session ledger {path}: "
                                      f"{_reason(exc)}") from None
                ledger.notes.append(
                    f"{path}: cut a torn last line ({torn} bytes) left by a crash; "
                    f"{count} earlier events kept"
                )
            ledger.recover()
        except BaseException:
            os.close(fd)
            raise
        return ledger

    def read(self, session_id: str) -> list[Event]:
        """Every event of a session, without locking or repairing (a torn tail is skipped)."""
        return read_lines(self.path(session_id), self.codec)[0]

    def remove(self, session_id: str) -> Path:
        """Delete a session's file; refused while another process holds its lock, and for
        anything that is not a regular file."""
        path = self.path(session_id)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise UsageError(f"no session {session_id!r} (looked for {path})") from None
        except OSError as exc:
            raise LedgerError(f"cannot remove session ledger {path}: {_reason(exc)}") from None
        try:
            _check_regular(fd, path)
            _lock(fd, session_id, path)
            try:
                path.unlink()
            except OSError as exc:
                raise LedgerError(f"cannot remove session ledger {path}: "
                                  f"{_reason(exc)}") from None
        finally:
            os.close(fd)
        return path

    def ids(self) -> list[str]:
        """Session ids, newest first (every ``*.jsonl`` name, whatever kind of file it is)."""
        try:
            names = [p.stem for p in self.directory.glob("*.jsonl")]
        except OSError as exc:  # pragma: no cover - glob swallows most errors itself
            raise LedgerError(f"cannot list sessions in {self.directory}: {_reason(exc)}") from None
        if not names and self.directory.exists() and not os.access(self.directory, os.R_OK):
            raise LedgerError(f"cannot list sessions in {self.directory}: permission denied")
        return sorted(names, reverse=True)

    def info(self, session_id: str) -> SessionInfo:
        """A session's summary without parsing the whole ledger: the first lines give agent,
        start, parent and first prompt; turns are counted as bytes (an event tag cannot
        appear unescaped inside a JSON string); the model is the last turn's that named one.
        ``dsh sessions list`` stays quick over many long sessions. An empty file (a run that
        died before its first event) is a :class:`LedgerError`: it is not a session."""
        path = self.path(session_id)
        data = read_ledger_file(path)
        if not data.strip():
            raise LedgerError(f"{path} is empty (a run that ended before its first event)")
        starts = _turn_starts(data)
        info: dict[str, Any] = {"id": session_id, "path": path, "turns": len(starts)}
        codec = self.codec
        for lineno, line in enumerate(data.split(b"\n", 64)[:64], 1):
            if not line.strip() or b"\n" in line:
                break
            try:
                event = parse_line(line, codec, f"{path}:{lineno}", lineno - 1)
            except LedgerError:
                break
            if isinstance(event, TurnStarted):
                info.setdefault("agent", event.agent)
                info.setdefault("started", event.ts)
                if event.parent and "parent" not in info:
                    info["parent"] = event.parent
                if event.model and "model" not in info:
                    info["model"] = event.model
            elif isinstance(event, UserMessage):
                info["first_prompt"] = event.text
                break
        # The model: the last turn/start that named one (null means unchanged), looking back
        # over at most 64 turns so that a long session stays quick to list.
        for start in (reversed(starts[-64:]) if len(starts) > 1 else ()):
            stop = data.find(b"\n", start)
            line = data[start:stop if stop != -1 else len(data)]
            try:
                turn = codec.load(line)
            except (LedgerError, RecursionError):
                continue
            if (isinstance(turn, TurnStarted) and turn.model
                    and not _SURROGATE_ESCAPE.search(line)):
                info["model"] = turn.model
                break
        return SessionInfo(**info)

    def sessions(self, on_skip: Callable[[Path, str], None] | None = None
                 ) -> Iterator[SessionInfo]:
        """Every readable session, newest first. One that cannot be summarised (unreadable,
        not a regular file, empty) is skipped — never the ones after it — and, with
        ``on_skip``, reported as ``on_skip(path, reason)``."""
        for sid in self.ids():
            try:
                yield self.info(sid)
            except (LedgerError, UsageError) as exc:
                if on_skip is not None:
                    on_skip(self.directory / f"{sid}.jsonl", str(exc))
                continue

    # -- attachments (issue 17): bytes by content hash, shared by the store's sessions ------

    def attachment_path(self, sha256: str) -> Path:
        """``<dir>/attachments/<sha256>``; anything but 64 lower-case hex digits is refused
        (a hash read from a ledger names no other file)."""
        if not _SHA256.fullmatch(sha256):
            raise LedgerError(f"invalid attachment hash {sha256[:80]!r}")
        return self.directory / "attachments" / sha256

    def put_attachment(self, data: bytes) -> str:
        """Store ``data`` under its SHA-256 (once: a file already there with the right bytes
        is kept) and return the hash. Written atomically — a ``0600`` temporary file in the
        same folder, fsynced, renamed — so a crash never leaves a partial blob under a hash;
        a file there whose bytes do not match (altered) is replaced."""
        import hashlib

        sha = hashlib.sha256(data).hexdigest()
        path = self.attachment_path(sha)
        folder = path.parent
        with contextlib.suppress(LedgerError, OSError):
            if hashlib.sha256(self._read_blob(path)).hexdigest() == sha:
                return sha
        tmp = folder / f".tmp-{os.getpid()}-{os.urandom(6).hex()}"
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise LedgerError(f"cannot store attachment in {folder}: {_reason(exc)}") from None
        return sha

    def get_attachment(self, sha256: str) -> bytes:
        """The bytes stored under ``sha256`` (the caller checks them against the hash:
        :func:`dsh.llm.attachments.verified`). Missing:
        :class:`dsh.ledger.blobs.AttachmentMissing`.
        """
        from dsh.ledger.blobs import AttachmentMissing

        path = self.attachment_path(sha256)
        try:
            return self._read_blob(path)
        except FileNotFoundError:
            raise AttachmentMissing(f"no attachment file {path}") from None

    @staticmethod
    def _read_blob(path: Path) -> bytes:
        """A blob file's bytes: a regular file (a symlink planted there is not followed),
        read up to the largest attachment plus one byte."""
        from dsh.ledger.blobs import READ_CAP

        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            _check_regular(fd, path)
            chunks = []
            total = 0
            while total <= READ_CAP:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def latest(self, agent: str | None = None) -> str | None:
        """The newest session (of ``agent``) with at least one readable event."""
        for info in self.sessions():
            if agent is None or info.agent == agent:
                return info.id
        return None


def _owner_hint(path: Path, exc: OSError) -> str:
    """For a permission error on a file someone else owns (``sudo dsh`` made it): say so."""
    if not isinstance(exc, PermissionError):
        return ""
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return ""
    if owner != os.geteuid():
        return f" (the file belongs to user id {owner}: was it made by `sudo dsh`?)"
    return ""


_SHA256 = re.compile(r"[0-9a-f]{64}")
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


def _lock(fd: int, session_id: str, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SessionInUse(
            f"session {session_id} is in use by another process (lock held on {path})"
        ) from None


def default_data_dir() -> Path:
    """``$DSH_HOME``, else ``$XDG_DATA_HOME/dsh``, else ``~/.local/share/dsh``."""
    home = os.environ.get("DSH_HOME")
    if home:
        return Path(home)
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local/share")
    return Path(xdg) / "dsh"


@hookimpl(trylast=True)
def session_store(app: Any) -> JsonlStore:
    cfg = app.config
    directory = (Path(cfg.sessions_dir).expanduser() if cfg.sessions_dir
                 else default_data_dir() / "sessions")
    return JsonlStore(directory, fsync=cfg.fsync, codec=None)
