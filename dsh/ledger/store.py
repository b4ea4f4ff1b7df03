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

This module holds the store (:class:`JsonlStore`: files by session id, create, open and
repair, lock, list, summarise) and the ``session_store`` hook; an open session being written
is :class:`~dsh.ledger.writer.Ledger` (:mod:`dsh.ledger.writer`), reading and checking lines
is :mod:`dsh.ledger.scan`, attachment files are :mod:`dsh.ledger.blobs`. Their names are
re-exported here: this was one module until the split.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from dsh.core.errors import LedgerError
from dsh.core.errors import SessionInUse
from dsh.core.errors import UsageError
from dsh.core.files import fsync_dir
from dsh.core.files import reason as _reason
from dsh.hookspecs import hookimpl
from dsh.ledger.blobs import BlobFiles
from dsh.ledger.blobs import MemoryBlobs as MemoryBlobs  # re-exported
from dsh.ledger.events import Event
from dsh.ledger.events import SessionForked
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UserMessage
from dsh.ledger.history import Projection
from dsh.ledger.scan import _SURROGATE_ESCAPE
from dsh.ledger.scan import Sink as Sink  # re-exported
from dsh.ledger.scan import _check_regular
from dsh.ledger.scan import _turn_starts
from dsh.ledger.scan import parse_line as parse_line  # re-exported
from dsh.ledger.scan import read_ledger_file
from dsh.ledger.scan import read_lines
from dsh.ledger.scan import scan
from dsh.ledger.serialize import EventCodec
from dsh.ledger.serialize import default_codec
from dsh.ledger.writer import FSYNC_POLICIES as FSYNC_POLICIES  # re-exported
from dsh.ledger.writer import INTERRUPTED as INTERRUPTED  # re-exported
from dsh.ledger.writer import Ledger
from dsh.ledger.writer import new_session_id
from dsh.ledger.writer import sanitized as sanitized  # re-exported

#: The longest session id, in bytes: ``ID.jsonl`` must fit a file name (255 bytes).
MAX_ID_BYTES = 200


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
    #: The working directory of the session's first turn (``turn/start`` ``cwd``).
    cwd: str | None = None
    #: The session this one was forked from (its first line is ``session/fork``).
    forked_from: str | None = None
    #: Tokens per model over the whole ledger: ``(model, input, output, cache read, cache
    #: write)``; empty when the summary did not read the whole ledger.
    usage: tuple[tuple[str, int, int, int, int], ...] = ()


class JsonlStore(BlobFiles):
    """The built-in session store: ``<dir>/<session>.jsonl`` (attachments: :class:`BlobFiles`)."""

    def __init__(self, directory: Path, *, fsync: str = "step", codec: EventCodec | None = None):
        self.directory = directory
        self.fsync = fsync
        self._codec = codec
        self._session_index: Any = None

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
            fsync_dir(self.directory)
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

            def fresh() -> Callable[[Any], None]:
                ledger.projection = Projection()
                return ledger.projection.apply

            def fresh_raw() -> Callable[[dict[str, Any], str], None]:
                ledger.projection = Projection()
                apply_raw = ledger.projection.apply_raw
                return lambda d, line: apply_raw(d, line=line)

            # Lines are projected as they are parsed — straight from the JSON objects when
            # they are all well-formed — and never kept: resuming a long session costs the
            # projection's memory and time, not the events' (benchmarks/resume.py).
            good, torn = scan(path, self.codec, fresh, fresh_raw)
            if torn:
                try:
                    os.ftruncate(fd, good)
                    os.fsync(fd)
                except OSError as exc:
                    raise LedgerError(f"cannot repair session ledger {path}: "
                                      f"{_reason(exc)}") from None
                ledger.notes.append(  # both paths fold seq 0, 1, 2… in order: seq + 1 of them
                    f"{path}: cut a torn last line ({torn} bytes) left by a crash; "
                    f"{ledger.projection.seq + 1} earlier events kept"
                )
            ledger.projection.seal()  # from now on only the ledger folds events in
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
        return self.summary(session_id)[0]

    def summary(self, session_id: str) -> tuple[SessionInfo, bool]:
        """:meth:`info`, and whether it is settled: the first user message was read, so
        appending to the ledger can change only its turns and model (the session index
        checks an unsettled one again at every listing)."""
        settled = False
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
            if isinstance(event, SessionForked):
                info.setdefault("forked_from", event.parent)
            elif isinstance(event, TurnStarted):
                info.setdefault("agent", event.agent)
                info.setdefault("started", event.ts)
                if event.parent and "parent" not in info:
                    info["parent"] = event.parent
                if event.model and "model" not in info:
                    info["model"] = event.model
                if event.cwd and "cwd" not in info:
                    info["cwd"] = event.cwd
            elif isinstance(event, UserMessage):
                info["first_prompt"] = event.text
                settled = True
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
        if "cwd" not in info and starts:
            info["cwd"] = _first_cwd(data, starts, codec)
        return SessionInfo(**info), settled

    def sessions(self, on_skip: Callable[[Path, str], None] | None = None, *,
                 agent: str | None = None, roots: bool = False) -> Iterator[SessionInfo]:
        """Every readable session (of ``agent``; without a parent, with ``roots``), newest
        first. One that cannot be summarised (unreadable, not a regular file, empty) is
        skipped — never the ones after it — and, with ``on_skip``, reported as
        ``on_skip(path, reason)``.

        Answered from the session index (:mod:`dsh.ledger.index`), checked against the
        ledgers; from the ledgers themselves when the index cannot be used (one warning)."""
        index = self._index()
        last: str | None = None
        if index is not None:
            from dsh.ledger.index import IndexUnusable
            from dsh.ledger.index import warn_once

            try:
                for info in index.sessions(on_skip, agent=agent, roots=roots):
                    last = info.id
                    yield info
                return
            except IndexUnusable as exc:
                warn_once(f"session index not used ({exc}); listing from the ledgers")
                index.close()
                if last is not None:  # what was yielded stays; the rest from the ledgers
                    on_skip = None
        for info in self._scan(on_skip):
            if last is not None and info.id >= last:
                continue
            if (agent is None or info.agent == agent) and not (roots and info.parent):
                yield info

    def _scan(self, on_skip: Callable[[Path, str], None] | None = None
              ) -> Iterator[SessionInfo]:
        """Every readable session, newest first, each ledger read (no index)."""
        for sid in self.ids():
            try:
                yield self.info(sid)
            except (LedgerError, UsageError) as exc:
                if on_skip is not None:
                    on_skip(self.directory / f"{sid}.jsonl", str(exc))
                continue

    def _index(self) -> Any:
        """The session index of this folder, or None: no folder yet (nothing to list), or
        one this user may not write (the ledgers are read directly)."""
        if self._session_index is None:
            if not os.access(self.directory, os.W_OK | os.X_OK):
                return None
            from dsh.ledger.index import SessionIndex

            self._session_index = SessionIndex(self)
        return self._session_index

    def matching(self, prefix: str) -> list[str]:
        """The session ids that start with ``prefix`` (from the index) or, for a short form
        (:func:`is_short_form`: 4 characters or more, no ``-``), whose random last part ends
        with it (``1a0a61`` or ``0a61`` for ``20261202-060357.140-1a0a61``); newest first."""
        found = self._prefixed(prefix)
        if is_short_form(prefix):
            seen = set(found)
            found += [i for i in self.ids() if i not in seen and short_form_of(i, prefix)
                      and not os.path.islink(self.directory / f"{i}.jsonl")]
            found.sort(reverse=True)
        return found

    def _prefixed(self, prefix: str) -> list[str]:
        index = self._index()
        if index is not None:
            from dsh.ledger.index import IndexUnusable
            from dsh.ledger.index import warn_once

            try:
                return list(index.matching(prefix))
            except IndexUnusable as exc:
                warn_once(f"session index not used ({exc}); listing from the ledgers")
                index.close()
        return [i for i in self.ids() if i.startswith(prefix)]

    def latest(self, agent: str | None = None, *, cwd: str | None = None) -> str | None:
        """The newest session (of ``agent``; recorded in directory ``cwd``, if given) with at
        least one readable event. A session recorded by a dsh that did not record
        directories has none: it is never the latest of a directory."""
        for info in self.sessions(agent=agent):
            if cwd is None or info.cwd == cwd:
                return info.id
        return None


#: The shortest short form of a session id accepted (:meth:`JsonlStore.matching`).
SHORT_FORM_CHARS = 4


def is_short_form(text: str) -> bool:
    """Whether ``text`` may be the short form of an id: the end of its random last part."""
    return len(text) >= SHORT_FORM_CHARS and "-" not in text


def short_form_of(session_id: str, text: str) -> bool:
    """Whether ``text`` is a short form of ``session_id``: its last ``-`` part ends with it."""
    return session_id.rpartition("-")[2].endswith(text)


def _first_cwd(data: bytes, starts: list[int], codec: EventCodec) -> str | None:
    """The ``cwd`` of the first ``turn/start`` that names one, for a session whose first
    lines name none (an older dsh began it, this one continued it); None when none does."""
    for start in starts:
        stop = data.find(b"\n", start)
        line = data[start:stop if stop != -1 else len(data)]
        if b'"cwd"' not in line:
            continue
        try:
            turn = codec.load(line)
        except (LedgerError, RecursionError):
            continue
        if isinstance(turn, TurnStarted) and turn.cwd and not _SURROGATE_ESCAPE.search(line):
            return turn.cwd
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

