"""An open session being written: :class:`Ledger`, and what it stamps on each event.

A :class:`Ledger` appends events — each one line, one ``write(2)`` on an ``O_APPEND``
descriptor, under a lock because plugins write from worker threads — feeds each into the
projection (:mod:`dsh.ledger.history`), fsyncs per its policy at step boundaries, notices a
file deleted under it (:attr:`Ledger.lost`), removes a file it created and never wrote, and
on resume closes what a crash left open (:meth:`Ledger.recover`). Here too: session ids
(:func:`new_session_id`), timestamps, and :func:`sanitized` (lone surrogates replaced, the
line says how many). Opening, locking and finding files is :mod:`dsh.ledger.store`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from typing import TypeVar

import attrs

from dsh.core.errors import LedgerError
from dsh.core.errors import UsageError
from dsh.core.files import reason as _reason
from dsh.core.messages import FrozenDict
from dsh.core.messages import FrozenList
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
from dsh.core.sanitize import clean_value
from dsh.ledger.blobs import MemoryBlobs
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextCompacted
from dsh.ledger.events import ContextInjected
from dsh.ledger.events import Event
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.history import _LEDGER
from dsh.ledger.history import Projection
from dsh.ledger.serialize import _LINE_DUMPERS
from dsh.ledger.serialize import dump_event
from dsh.ledger.serialize import dumps as _dumps
from dsh.ledger.serialize import line_dumper

E = TypeVar("E", bound=Event)


class _Critical:
    """The main thread's appends in progress. dsh's signal handlers (Ctrl-C, SIGTERM, SIGHUP:
    dsh.cli.terminal) raise KeyboardInterrupt in the main thread wherever it is; inside an
    append that would leave a line written but not projected (the next line repeating its
    ``seq``, or a request missing what the ledger holds). While :attr:`depth` is non-zero a
    handler sets :attr:`pending` instead, and the append raises the KeyboardInterrupt when it
    has written and projected its line (:func:`interrupt_or_defer`)."""

    depth = 0
    pending = False


CRITICAL = _Critical()
_MAIN = threading.main_thread()
_MAIN_IDENT = _MAIN.ident
_get_ident = threading.get_ident


def interrupt_or_defer() -> None:
    """For a signal handler: raise KeyboardInterrupt now, or, inside an append of the main
    thread, when that append is done."""
    if CRITICAL.depth:
        CRITICAL.pending = True
        return
    raise KeyboardInterrupt
FSYNC_POLICIES = ("event", "step", "never")
INTERRUPTED = "interrupted: the run ended before this tool returned"


def new_session_id() -> str:
    """Sortable by creation time (to the millisecond), unique enough:
    ``20261130-142501.123-3f9a1c``."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return f"{stamp}.{int(now * 1000) % 1000:03d}-{os.urandom(3).hex()}"


_SECOND: list[Any] = [-1, ""]
#: ``.000Z`` … ``.999Z``: the millisecond tails, formatted once.
_MILLIS = tuple(f".{i:03d}Z" for i in range(1000))


def _now() -> str:
    """ISO-8601 UTC with milliseconds, ``2026-11-30T14:25:01.123Z``; the formatted second is
    reused while it lasts (every event of a step is stamped here)."""
    now = time.time()
    second = int(now)
    if second != _SECOND[0]:
        _SECOND[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))]
    return _SECOND[1] + _MILLIS[int((now - second) * 1000)]


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



#: The events the projection takes values from (``Projection.apply``): every other event only
#: advances its ``seq``.
_PROJECTED = frozenset({UserMessage, AssistantMessage, ToolReturned, ContextInjected,
                        StepStarted, TurnStarted, ContextCompacted, PluginEvent})


def _exact(event: Event) -> bool:
    """The steps' hot events, when every value the projection takes from them is of an exact
    built-in type: then no object protocol can make the projection differ from the line, and
    the event is folded as it is (one ``json.loads`` less: ``benchmarks/steps.py``). Anything
    else — other types, subclasses, a lying property — is folded from its decoded line."""
    t = type(event)
    e: Any = event
    if t not in _PROJECTED:
        return True  # the projection takes nothing from it but its seq (dsh's own int)
    if t is ToolReturned:
        return (type(e.call_id) is str and type(e.name) is str and type(e.status) is str
                and type(e.output) is str)
    if t is StepStarted:
        return type(e.step) is int
    if t is AssistantMessage:
        # Only an answer without tool calls or reasoning: their argument mappings are shared
        # with whoever returned the response, who could change them in place afterwards
        # (dict.__setitem__ defeats FrozenDict); decoded, the projection's are its own.
        u = e.usage
        return (type(e.text) is str and type(e.tool_calls) is tuple and not e.tool_calls
                and type(e.reasoning) is tuple and not e.reasoning and type(u) is Usage
                and type(u.input_tokens) is int and type(u.output_tokens) is int)
    return False


class _NotPlain(Exception):
    """A value that is not made of JSON's exact built-in types (see :func:`_plain_copy`)."""


_SCALARS = frozenset({str, int, float, bool, type(None)})
_MAPPINGS = frozenset({dict, FrozenDict})
_SEQUENCES = frozenset({list, tuple, FrozenList})
#: Deeper than this is left to the decode path (json's own recursion limit decides there).
_COPY_DEPTH = 64


def _plain_copy(value: Any, depth: int = 0) -> Any:
    """A private deep copy of ``value`` when it is made only of JSON's exact built-in types
    (``str``/``int``/``float``/``bool``/``None``, ``dict`` with ``str`` keys, ``list`` and
    ``tuple`` — dsh's own frozen ones read through the base class, so no override runs);
    else :class:`_NotPlain`. Such a copy decodes from its own encoding to an equal value, so
    encoding it and folding it is folding the decoded line, without the decode."""
    t = type(value)
    if t in _SCALARS:
        return value
    if depth > _COPY_DEPTH:
        raise _NotPlain
    if t in _MAPPINGS:
        out = {}
        for k, v in dict.items(value):
            if type(k) is not str:
                raise _NotPlain
            out[k] = v if type(v) in _SCALARS else _plain_copy(v, depth + 1)
        return out
    if t in _SEQUENCES:
        items = list.__iter__(value) if t is not tuple else tuple.__iter__(value)
        return [v if type(v) in _SCALARS else _plain_copy(v, depth + 1) for v in items]
    raise _NotPlain


def _own_calls(event: Any) -> list[dict[str, Any]] | None:
    """For an answer with tool calls and nothing else the projection could be lied to with
    (exact types throughout, no reasoning): the calls' JSON objects as private plain copies,
    which are both what the line is encoded from and what the projection folds. None when
    the answer must take the decode path."""
    u = event.usage
    if not (type(event.text) is str and type(event.tool_calls) is tuple
            and type(event.reasoning) is tuple and not event.reasoning and type(u) is Usage
            and type(u.input_tokens) is int and type(u.output_tokens) is int):
        return None
    calls = []
    try:
        for c in tuple.__iter__(event.tool_calls):
            if type(c) is not ToolCall or type(c.id) is not str or type(c.name) is not str:
                return None
            args = c.arguments
            if type(args) not in _MAPPINGS:
                return None
            calls.append({"id": c.id, "name": c.name, "arguments": _plain_copy(args)})
    except (_NotPlain, RecursionError):
        return None
    return calls


def _encoded(event: Event) -> tuple[bytes, list[dict[str, Any]] | None]:
    """The event's line as bytes (newline included), and, for an answer with tool calls the
    projection may fold without decoding, the calls the line was encoded from
    (:func:`_own_calls`)."""
    calls = None
    dump = _LINE_DUMPERS.get(type(event)) or line_dumper(type(event))
    if dump is None or event.extra:
        d: Any = None
        line = dump_event(event)
    else:
        d = dump(event)
        if type(event) is AssistantMessage and event.tool_calls:
            calls = _own_calls(event)
            if calls is not None:
                d["tool_calls"] = calls
        line = _dumps(d)
    return (line + "\n").encode(), calls


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
        self._projection.seal()
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
        #: Fragments (``dsh run -f``) the next user message starts with: recorded by hash.
        self._fragments: tuple[Any, ...] = ()
        #: The ``seq`` of the last line written to the file. Set in the same breath as the
        #: write (no call between them, so no signal handler runs in between): a
        #: KeyboardInterrupt raised by dsh's SIGTERM/SIGHUP/Ctrl-C handler after the bytes
        #: went out but before the projection took the event cannot make the next line (the
        #: abort's own tool/result, turn/end) repeat its ``seq``.
        self._written = -1
        #: True when a line was written since the step boundary's last fsync: a boundary
        #: with nothing new to flush (closing right after a turn's end) skips its fsync.
        self._unsynced = False

    @property
    def blobs(self) -> Any:
        """Where this session's attachment bytes are kept (``put_attachment`` /
        ``get_attachment``, issue 17): the session store that opened it, or memory for an
        in-memory ledger; None for a store that keeps no attachments."""
        if self._blobs is None and self.path is None:
            self._blobs = self._projection.blobs = MemoryBlobs()
        return self._blobs

    @blobs.setter
    def blobs(self, value: Any) -> None:
        self._blobs = self._projection.blobs = value

    def expect_fragments(self, fragments: tuple[Any, ...]) -> None:
        """The next ``user/message`` begins with the blocks of ``fragments`` (objects with
        ``name`` and ``text``: ``dsh run -f``): record their texts once by hash in the blob
        store and only references on the line (:mod:`dsh.ledger.fragments`). A message that
        does not begin with exactly those blocks (a ``pre_step`` rewrote it) is recorded
        whole, as is every later one."""
        self._fragments = tuple(fragments)

    @property
    def closed(self) -> bool:
        return self._fd is None and self.path is not None

    def append(self, cls: type[E], **fields: Any) -> E:
        """Build, write and project one event; return it (sanitised, if it had to be).
        Thread-safe: each event gets the next ``seq`` and is written whole."""
        main = _get_ident() == _MAIN_IDENT
        with self._lock:
            if cls is UserMessage and self._fragments:
                fields = self._with_fragments(fields)
            if main:
                CRITICAL.depth += 1
            try:
                seq = self._projection.seq
                if self._written > seq:  # written, then interrupted before it was projected
                    seq = self._written
                event = self._write(cls(seq=seq + 1, ts=_now(), session=self.session_id,
                                        **fields))
            finally:
                if main:
                    CRITICAL.depth -= 1
                    if CRITICAL.pending and not CRITICAL.depth:
                        CRITICAL.pending = False
                        raise KeyboardInterrupt  # the signal that came during the append
            # Outside the critical section: an observer (a plugin's, the screen) that blocks
            # must not make Ctrl-C or SIGTERM wait for it.
            if self.observer is not None:
                self.observer(event)
            return event

    def _with_fragments(self, fields: dict[str, Any]) -> dict[str, Any]:
        from dsh.ledger import fragments

        expected, self._fragments = self._fragments, ()
        text = fields.get("text")
        rest = fragments.split(text, expected) if type(text) is str else None
        if rest is None or fields.get("fragments"):
            return fields
        refs = fragments.store(self.blobs, expected)
        return fields if refs is None else {**fields, "text": rest, "fragments": refs}

    def adopt(self, event: Event) -> Event:
        """Write ``event`` — a line of another session's ledger, or a ``session/fork`` line —
        as this session's next line: ``seq`` and ``session`` renumbered, every other field
        (and the unknown ones in ``extra``) kept. What a fork is made of
        (:mod:`dsh.ledger.fork`)."""
        from dsh.ledger.events import UnknownEvent

        with self._lock:
            seq = max(self.projection.seq, self._written) + 1
            fields: dict[str, Any] = {"seq": seq, "session": self.session_id,
                                      "ts": event.ts or _now()}
            if type(event) is UnknownEvent:  # written back from its raw object
                fields["extra"] = {**event.extra, **fields}
            return self._write(attrs.evolve(event, **fields))

    @property
    def projection(self) -> Projection:
        """What the next request contains: read-only to everyone but this ledger, which feeds
        it the event decoded from the bytes it just wrote (issue 23, the byte rule)."""
        return self._projection

    @projection.setter
    def projection(self, value: Projection) -> None:
        # sealed from the first event written on: loading (dsh.ledger.store) folds the file's
        # lines in first, through the projection's own apply/apply_raw
        self._projection = value
        if value.blobs is None:  # it reads fragment texts where attachments are
            value.blobs = getattr(self, "_blobs", None)

    def _write(self, event: E) -> E:
        try:
            data, calls = _encoded(event)
        except UnicodeEncodeError:
            event = sanitized(event)
            data, calls = _encoded(event)
        if self._fd is not None:
            try:
                n = os.write(self._fd, data)
                self._written = event.seq  # no call since the write: see __init__
                if n != len(data):  # pragma: no cover - regular files do not short-write
                    raise OSError(f"short write ({n} of {len(data)} bytes)")
                self._unsynced = True  # (still True after "event"'s own fsync: the boundary
                if self.fsync == "event":  # fsyncs once more, as it always has)
                    os.fsync(self._fd)
            except OSError as exc:
                raise LedgerError(f"cannot write session ledger {self.path}: "
                                  f"{_reason(exc)}") from exc
        elif self.path is not None:
            raise LedgerError(f"session {self.session_id} is closed")
        # The byte rule (issue 23, MISSION C3): the projection — everything a request is made
        # of — is fed the plain values decoded from the line just written, never the objects
        # a plugin or strategy handed over (a str subclass, a property, a lying __format__ or
        # __eq__ does not survive the trip through JSON).
        if calls is not None:  # the line was encoded from these private plain copies
            self._projection.apply(event, _LEDGER, tuple(
                ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in calls))
        elif _exact(event):  # nothing in it can lie: folding it is folding its decoded line
            self._projection.apply(event, _LEDGER)
        else:
            self._projection.apply_raw(json.loads(data), _LEDGER)
        return event

    def step_boundary(self) -> None:
        """Make everything written so far durable, per the fsync policy (one ``fsync`` when a
        line was written since the last one, none otherwise), and check that the file is
        still there: a ledger deleted during the run (its folder removed) raises
        :class:`LedgerError` once and sets :attr:`lost`."""
        if self._fd is None:
            return
        if self.fsync != "never" and self._unsynced:
            try:
                os.fsync(self._fd)
                self._unsynced = False
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

