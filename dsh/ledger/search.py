"""Full-text search over the session ledgers, and each session's tokens per model (issue 37,
item 4), kept in the session index (:mod:`dsh.ledger.index`) beside the summaries.

What is searched: every ``user/message`` text, ``assistant/message`` text, ``tool/call`` (the
tool's name and its arguments as JSON) and ``tool/result`` output, each with its turn — the
first :data:`MAX_TEXT` characters of each. A query is the user's plain text, never FTS
syntax: its words (runs of letters and digits, split as SQLite's ``unicode61`` tokenizer
splits them) must all appear in one message, call or result, in any order, case ignored.
Each word goes to FTS5 as a quoted string, so ``NEAR``, ``OR``, ``*`` and ``"`` are text like
any other; at most :data:`MAX_TERMS` of them (the longest) are asked of FTS5, the others
checked here on what it found, so a 1 MB query costs its length, not an FTS5 expression of
its size.

How the index keeps it (the rules of :mod:`dsh.ledger.index` hold here too):

* ``reads`` records, per ledger, how far it was read (only complete lines: a torn last line
  waits), its stamp then, the turn and model at that point, the tokens per model so far, and
  the last bytes read. When the stamp moves, a ledger that grew and still holds those bytes
  where reading stopped is read on from there; any other (shorter, rewritten, replaced) is
  read again from the start and its old documents dropped;
* every search ``stat``-s every listed ledger and reads what moved, so an appended,
  hand-copied or rewritten ledger is found as it is now; ``sessions list`` reads only the
  ledgers it shows (for their usage and cost);
* reading is done in ``BEGIN IMMEDIATE`` batches, each ledger's row looked at again inside
  the transaction: two processes catching up the same ledgers serialise, and the second
  finds the work done;
* ledgers are opened by the folder's own names (rows naming other files were dropped by the
  index), ``O_NOFOLLOW | O_NONBLOCK``, and read only when they are regular files: a symbolic
  link is never read through, a FIFO never waited on;
* a damaged index is rebuilt and a locked one passed over, as for listing; where SQLite has
  no FTS5 (or the index is unusable) the ledgers are read one by one, with one
  ``dsh: warning:`` line. Both ways find the same hits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import stat
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.ledger.index import _COLUMNS
from dsh.ledger.index import IndexUnusable
from dsh.ledger.index import SessionIndex
from dsh.ledger.index import _well_typed
from dsh.ledger.index import info_of
from dsh.ledger.index import inside
from dsh.ledger.index import stamp_of
from dsh.ledger.index import warn_once

if TYPE_CHECKING:
    from dsh.ledger.store import SessionInfo

#: Characters of one message, call or result that are searched (the rest is not indexed).
MAX_TEXT = 64 * 1024
#: Words of a query asked of FTS5; the others are checked on what it finds.
MAX_TERMS = 32
#: Ledgers read per write transaction.
BATCH = 256
#: Bytes before the point reading stopped that must still be there to read on from it.
TAIL = 64
CHUNK = 1 << 20
_WORD = re.compile(r"[^\W_]+")
_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
Usage = tuple[tuple[str, int, int, int, int], ...]


@attrs.frozen
class Hit:
    """One message, tool call or tool result that matched."""

    session: SessionInfo
    turn: int
    seq: int
    #: ``user``, ``assistant``, ``call`` or ``result``.
    kind: str
    #: The tool's name (``call``, ``result``), else None.
    name: str | None
    text: str


def words(text: str) -> list[str]:
    """The distinct words of ``text``, lower-cased, in order of first appearance."""
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(text)))


def fts_query(terms: list[str]) -> str:
    """An FTS5 expression matching rows holding every one of ``terms`` (quoted strings)."""
    return " ".join('"' + t.replace('"', '""') + '"' for t in terms)


def matches(terms: list[str], text: str) -> bool:
    """Whether ``text`` holds every one of ``terms`` as a word (what FTS5 answers)."""
    have = set(words(text))
    return all(t in have for t in terms)


# --- reading a ledger --------------------------------------------------------------------


def _clean(value: Any) -> str | None:
    if type(value) is not str or not value:
        return None
    value = value[:MAX_TEXT]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a hand-written \ud800): SQLite takes UTF-8
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


class Reading:
    """What reading a ledger so far has found: the documents, the turn and model at the end,
    the tokens per model (``[input, output, cache read, cache write]``)."""

    def __init__(self, turn: int = 0, model: str = "",
                 usage: dict[str, list[int]] | None = None) -> None:
        self.turn = turn
        self.model = model
        self.usage: dict[str, list[int]] = usage if usage is not None else {}
        self.docs: list[tuple[int, int, str, str | None, str]] = []

    def _doc(self, seq: int, kind: str, name: Any, text: Any) -> None:
        body = _clean(text)
        if body is not None:
            self.docs.append((seq, self.turn, kind, name if type(name) is str else None, body))

    def fold(self, line: bytes) -> None:
        try:
            d = json.loads(line)
        except (ValueError, RecursionError):
            return  # not this module's to report: the ledger's reader names the line
        if type(d) is not dict:
            return
        kind = d.get("type")
        seq = d.get("seq") if type(d.get("seq")) is int else -1
        if kind == "turn/start":
            if type(d.get("turn")) is int:
                self.turn = d["turn"]
            if type(d.get("model")) is str and d["model"]:
                self.model = d["model"]
        elif kind == "user/message":
            self._doc(seq, "user", None, d.get("text"))
        elif kind == "assistant/message":
            self._doc(seq, "assistant", None, d.get("text"))
            usage = d.get("usage")
            if type(usage) is dict:
                counts = [v if type(v) is int and v > 0 else 0
                          for v in (usage.get(k) for k in _USAGE_KEYS)]
                if any(counts):
                    model = d["model"] if type(d.get("model")) is str and d["model"] \
                        else self.model
                    total = self.usage.setdefault(model, [0, 0, 0, 0])
                    for i, v in enumerate(counts):
                        total[i] += v
        elif kind == "tool/call":
            name = d.get("name")
            try:
                args = json.dumps(d.get("arguments"), ensure_ascii=False)
            except (ValueError, TypeError, RecursionError):
                args = ""
            self._doc(seq, "call", name, f"{name if type(name) is str else ''} {args}")
        elif kind == "tool/result":
            self._doc(seq, "result", d.get("name"), d.get("output"))

    def usage_tuple(self) -> Usage:
        return tuple((m, *v) for m, v in sorted(self.usage.items()))  # type: ignore[misc]


@attrs.frozen
class Read:
    """One reading of a ledger: its stamp, how far it got, its last bytes, what it found, and
    whether it started over (the documents read before are stale)."""

    stamp: str
    offset: int
    tail: bytes
    reading: Reading
    restart: bool


def read_ledger(path: Path, prior: tuple[Any, ...] | None = None) -> Read | None:
    """Read ``path`` on from ``prior`` (a ``reads`` row: stamp, offset, tail, turn, model,
    usage) when it only grew since, else from the start; None when it is not a regular file
    (gone, a symbolic link, a FIFO, unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        start, tail, reading = 0, b"", Reading()
        if prior is not None:
            p_size, _, p_ino = prior[0].split(":") if prior[0].count(":") == 2 else ("", "", "")
            offset, p_tail = prior[1], prior[2]
            if (p_ino == str(st.st_ino) and str(st.st_size) != p_size
                    and len(p_tail) <= offset <= st.st_size
                    and os.pread(fd, len(p_tail), offset - len(p_tail)) == p_tail):
                start, tail = offset, p_tail
                reading = Reading(prior[3], prior[4], {m: list(v) for m, *v in prior[5]})
        pos, rest = start, b""
        while True:
            chunk = os.pread(fd, CHUNK, pos)
            if not chunk:
                break
            pos += len(chunk)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            for line in lines:
                if line.strip():
                    reading.fold(line)
        offset = pos - len(rest)
        if offset > start:  # the last bytes of what was read: the line before the cut
            tail = os.pread(fd, min(TAIL, offset), offset - min(TAIL, offset))
        return Read(stamp, offset, tail, reading, restart=start == 0)
    except OSError:
        return None
    finally:
        os.close(fd)


def _prior(row: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """A ``reads`` row as written here (a hand-edited one is read again from the start)."""
    if row is None or not (type(row[0]) is str and type(row[1]) is int
                           and type(row[2]) is bytes and type(row[3]) is int
                           and type(row[4]) is str and type(row[5]) is str):
        return None
    try:
        usage = json.loads(row[5])
        counts = tuple((m, *(int(x) for x in v)) for m, v in sorted(usage.items())
                       if type(m) is str and len(v) == 4 and all(type(x) is int for x in v))
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None
    return (*row[:5], counts)


def _usage_of(text: Any) -> Usage:
    """The ``usage`` of a ``reads`` row (JSON), checked."""
    prior = _prior(("", 0, b"", 0, "", text))
    return prior[5] if prior is not None else ()


# --- keeping the index -------------------------------------------------------------------


def _forget(conn: sqlite3.Connection, sid: str) -> None:
    conn.execute("DELETE FROM texts WHERE rowid IN (SELECT rowid FROM docs WHERE sid = ?)",
                 (sid,))
    conn.execute("DELETE FROM docs WHERE sid = ?", (sid,))
    conn.execute("DELETE FROM reads WHERE id = ?", (sid,))


def _catch_up(index: SessionIndex, conn: sqlite3.Connection, sids: list[str]) -> None:
    """Read the ledgers ``sids`` on into the index (each looked at again in the transaction:
    another process may have done it meanwhile)."""
    directory = index.store.directory
    for first in range(0, len(sids), BATCH):
        with _immediate(conn):
            rowid = conn.execute("SELECT coalesce(max(rowid), 0) FROM docs").fetchone()[0]
            for sid in sids[first:first + BATCH]:
                path = directory / f"{sid}.jsonl"
                row = conn.execute("SELECT stamp, offset, tail, turn, model, usage FROM reads "
                                   "WHERE id = ?", (sid,)).fetchone()
                prior = _prior(row)
                if prior is not None and prior[0] == stamp_of(path):
                    continue
                got = read_ledger(path, prior)
                if got is None or got.restart:
                    _forget(conn, sid)
                if got is None:
                    continue
                docs = [(rowid + i, sid, *doc) for i, doc in enumerate(got.reading.docs, 1)]
                rowid += len(docs)
                conn.executemany("INSERT INTO docs (rowid, sid, seq, turn, kind, name) "
                                 "VALUES (?, ?, ?, ?, ?, ?)", [d[:6] for d in docs])
                conn.executemany("INSERT INTO texts (rowid, body) VALUES (?, ?)",
                                 [(d[0], d[6]) for d in docs])
                conn.execute("INSERT OR REPLACE INTO reads (id, stamp, offset, tail, turn, "
                             "model, usage) VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (sid, got.stamp, got.offset, got.tail, got.reading.turn,
                              got.reading.model, json.dumps(got.reading.usage)))


def _freshen(index: SessionIndex, conn: sqlite3.Connection) -> None:
    """Make every listable row, and what was read of its ledger, agree with the ledger now;
    drop what was read of ledgers no longer listed."""
    prefix = os.path.join(os.fspath(index.store.directory), "")
    rows = conn.execute("SELECT s.id, s.stamp, r.stamp FROM sessions s LEFT JOIN reads r "
                        "ON r.id = s.id WHERE s.state != 'error'").fetchall()
    moved, unread, gone = [], [], []
    expected = 0  # the reads rows there should be: more means some are of unlisted ledgers
    lstat = os.lstat
    for sid, listed, read in rows:  # the one pass over every ledger: kept lean
        if not inside(sid):
            gone.append(sid)
            continue
        try:
            st = lstat(prefix + sid + ".jsonl")
            now: str | None = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        except (OSError, ValueError):
            now = None
        if now == listed == read:
            expected += 1
            continue
        if now != listed:
            full = conn.execute(f"SELECT {_COLUMNS} FROM sessions WHERE id = ?",
                                (sid,)).fetchone()
            fresh = index._fresh(full) if full is not None else None
            if fresh is None:
                gone.append(sid)
                continue
            moved.append(fresh)
            if fresh[2] == "error":
                continue
        expected += 1
        if now != read:
            unread.append(sid)
    index._update(conn, moved, gone)
    _catch_up(index, conn, unread)
    if conn.execute("SELECT count(*) FROM reads").fetchone()[0] <= expected:
        return
    orphans = [r for (r,) in conn.execute(
        "SELECT id FROM reads WHERE id NOT IN (SELECT id FROM sessions WHERE state != 'error')")]
    if orphans:
        with _immediate(conn):
            for sid in orphans:
                _forget(conn, sid)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: committed when the block ends, rolled back (and
    the error raised again) when it fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise


# --- searching -----------------------------------------------------------------------------


Accept = Callable[["SessionInfo"], bool]


def search(store: Any, text: str, *, accept: Accept | None = None, limit: int | None = None,
           per_session: bool = False,
           on_skip: Callable[[Path, str], None] | None = None) -> list[Hit]:
    """The messages, tool calls and tool results of ``store``'s sessions that hold every
    word of ``text``, newest session first and in ledger order within one, at most
    ``limit`` (of sessions, with ``per_session``: each session's first hit only). Sessions
    are those ``accept`` takes (their :class:`SessionInfo` has ``usage`` filled)."""
    terms = words(text)
    if not terms:
        return []
    index = store._index() if hasattr(store, "_index") else None
    if index is not None:
        try:
            for row in index.refresh():
                if on_skip is not None:
                    on_skip(store.directory / f"{row[0]}.jsonl", str(row[9]))
            if index._guarded(lambda conn: index.fts):
                found: list[Hit] = index._guarded(
                    lambda conn: _search_index(index, conn, terms, accept, limit, per_session))
                return found
            warn_once("this Python's SQLite has no FTS5: searching the ledgers one by one")
        except IndexUnusable as exc:
            warn_once(f"session index not used ({exc}); searching the ledgers")
            index.close()
            on_skip = None
    return _search_scan(store, terms, accept, limit, per_session, on_skip)


def _search_index(index: SessionIndex, conn: sqlite3.Connection, terms: list[str],
                  accept: Accept | None, limit: int | None, per_session: bool) -> list[Hit]:
    _freshen(index, conn)
    asked = sorted(terms, key=len, reverse=True)[:MAX_TERMS]
    check = len(asked) < len(terms)
    cursor = conn.execute(
        "SELECT d.sid, d.seq, d.turn, d.kind, d.name, texts.body, r.usage, "
        f"{', '.join('s.' + c for c in _COLUMNS.split(', '))} FROM texts "
        "JOIN docs d ON d.rowid = texts.rowid JOIN sessions s ON s.id = d.sid "
        "LEFT JOIN reads r ON r.id = d.sid "
        "WHERE texts MATCH ? AND s.state != 'error' ORDER BY d.sid DESC, d.seq",
        (fts_query(asked),))
    hits: list[Hit] = []
    infos: dict[str, SessionInfo | None] = {}
    taken: set[str] = set()  # the sessions with a hit
    for sid, seq, turn, kind, name, body, usage, *rest in cursor:
        if sid not in infos:
            row = tuple(rest)
            info = None
            if inside(sid) and _well_typed(row):
                info = attrs.evolve(info_of(row, index.store.directory), usage=_usage_of(usage))
            infos[sid] = info if info is not None and (accept is None or accept(info)) else None
        info = infos[sid]
        if info is None or (per_session and sid in taken) or (check and not matches(terms, body)):
            continue
        if per_session and limit is not None and len(taken) >= limit:
            break
        taken.add(sid)
        hits.append(Hit(info, turn, seq, kind, name, body))
        if limit is not None and not per_session and len(hits) >= limit:
            break
    return hits


def _search_scan(store: Any, terms: list[str], accept: Accept | None, limit: int | None,
                 per_session: bool, on_skip: Callable[[Path, str], None] | None) -> list[Hit]:
    """:func:`search` by reading every ledger (no index, or no FTS5)."""
    from dsh.ledger.reader import newest_sessions

    hits: list[Hit] = []
    sessions = 0
    for info in newest_sessions(store, on_skip=on_skip):
        if per_session and limit is not None and sessions >= limit:
            break
        got = read_ledger(info.path, None) if info.path is not None else None
        if got is None:
            continue
        info = attrs.evolve(info, usage=got.reading.usage_tuple())
        if accept is not None and not accept(info):
            continue
        found = [d for d in got.reading.docs if matches(terms, d[4])]
        if not found:
            continue
        sessions += 1
        for seq, turn, kind, name, body in found[:1] if per_session else found:
            hits.append(Hit(info, turn, seq, kind, name, body))
            if limit is not None and not per_session and len(hits) >= limit:
                return hits
    return hits


# --- usage -------------------------------------------------------------------------------


def with_usage(store: Any, infos: list[SessionInfo]) -> list[SessionInfo]:
    """``infos`` with their ``usage`` filled (tokens per model over the whole ledger): from
    the index, reading on only the ledgers that moved; else each ledger read."""
    index = store._index() if hasattr(store, "_index") else None
    if index is not None and infos:
        try:
            found: list[SessionInfo] = index._guarded(
                lambda conn: _usage_index(index, conn, infos))
            return found
        except IndexUnusable as exc:
            warn_once(f"session index not used ({exc}); listing from the ledgers")
            index.close()
    return [attrs.evolve(i, usage=_usage_read(i.path)) for i in infos]


def _usage_read(path: Path | None) -> Usage:
    got = read_ledger(path) if path is not None else None
    return got.reading.usage_tuple() if got is not None else ()


def _usage_index(index: SessionIndex, conn: sqlite3.Connection,
                 infos: list[SessionInfo]) -> list[SessionInfo]:
    if not index.fts:  # another Python's FTS5 index: what it keeps is not written here
        return [attrs.evolve(i, usage=_usage_read(i.path)) for i in infos]
    directory = index.store.directory

    def rows() -> dict[str, Any]:
        marks = ", ".join("?" * len(infos))
        return {r[0]: r[1:] for r in conn.execute(
            f"SELECT id, stamp, usage FROM reads WHERE id IN ({marks})",
            [i.id for i in infos])}

    have = rows()
    stale = [i.id for i in infos if inside(i.id)
             and (i.id not in have or have[i.id][0] != stamp_of(directory / f"{i.id}.jsonl"))]
    if stale:
        _catch_up(index, conn, stale)
        have = rows()
    return [attrs.evolve(i, usage=_usage_of(have[i.id][1]) if i.id in have else ())
            for i in infos]
