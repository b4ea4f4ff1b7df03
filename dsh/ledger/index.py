"""The session index: ``dsh sessions list``, ``latest``, id prefixes and ``-c`` without opening
every ledger (issue 27, item 5).

An embedded SQLite file, ``<sessions dir>/.index/sessions.sqlite3`` (``0600``, in a folder of
its own so that its journal files never change the sessions folder's mtime), holds one row per
``*.jsonl`` name: what ``sessions list`` shows (agent, model, start, turns, first prompt,
parent — never more than the ledger's own first lines hold) and the ledger's *stamp* (size,
mtime, inode) when it was summarised. The ledgers stay the truth: the index is a cache that is
checked before it is believed, and deleting it loses nothing.

How it stays true, cheaply:

* **New or removed files** change the sessions folder's mtime. The index keeps the folder's
  signature (device, inode, mtime) from its last full name listing; while the folder still
  has it, no listing is needed. When it differs, the names are listed (no file is opened) and
  only the new ledgers are summarised. A signature taken within :data:`RACY_FINE` seconds of
  its mtime (:data:`RACY` where the file system keeps whole seconds) is not kept: a file made
  in the same clock tick would not move the mtime ("racy git"), so the next listing looks
  again.
* **Appended ledgers** (a resumed session, by any dsh or by hand) change their stamp: every
  row about to be shown is ``stat``-ed and summarised again when its stamp moved; a row whose
  file is gone is dropped. Only the rows shown are checked, so ``--limit 20`` costs 20 stats.
* **Rows not yet settled** (a ledger that was empty, unreadable or had no user message yet
  when it was summarised) are checked on every listing; there are few.
* **A row never names a file outside the folder.** The index is a file anyone with the
  user's rights can edit: a row whose id is not a plain file name of the folder (``../x``,
  ``/elsewhere/x``) is dropped before anything is ``stat``-ed, opened or listed, and a
  ``*.jsonl`` name that is a symbolic link is not a session ledger (listed as skipped, never
  read through). Ids come back as the folder's own names, so ``sessions show`` and ``rm``
  never reach past it through the index.
* **A damaged index** (not a database, truncated, a wrong schema, wrong types in a row) is
  deleted and rebuilt from the ledgers; a **locked** one (busy past the timeout) is passed
  over for this listing. Either way the listing never fails: it falls back to reading the
  ledgers, with one ``dsh: warning:`` line on stderr per process.

The same file holds the full-text index of the sessions' messages, tool calls and results,
and each session's tokens per model (``dsh sessions search``, the cost in ``list``): tables
``reads``, ``docs`` and the FTS5 table ``texts``, kept by :mod:`dsh.ledger.search` under the
same rules (deleted, damaged or of another :data:`VERSION`: rebuilt from the ledgers).

Nothing on the ``dsh run`` path imports this module or :mod:`sqlite3`: a run that makes a new
session moves the folder's mtime, and the next listing picks the new ledger up.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from dsh.core.errors import LedgerError
from dsh.core.errors import UsageError
from dsh.core.files import reason as _reason

if TYPE_CHECKING:
    from dsh.ledger.store import JsonlStore
    from dsh.ledger.store import SessionInfo

#: Bumped when the schema changes: an index of another version is rebuilt.
VERSION = 2
#: A folder signature is kept only when its mtime is at least this many seconds old: on a
#: file system that keeps whole seconds (ext3, some NFS servers), and where it keeps finer
#: times (ext4, xfs, tmpfs: stamped from a clock that advances every few milliseconds).
RACY = 2.0
RACY_FINE = 0.1
#: How long a writer waits for another's lock before the listing passes the index over.
BUSY_MS = 2000
PAGE = 64

#: What :mod:`dsh.ledger.search` keeps of each ledger it read whole: ``reads`` (how far, the
#: turn and model there, tokens per model so far, the last bytes read, to tell an appended
#: ledger from a rewritten one) and ``docs`` (one row per message, tool call or tool result;
#: its text is the row of the same rowid in the FTS5 table ``texts``, made only where SQLite
#: has FTS5). Invariant: while ``texts`` exists, every ``reads`` row's documents are in it.
_TEXT_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS reads (id TEXT PRIMARY KEY, stamp TEXT NOT NULL, "
    "offset INTEGER NOT NULL, tail BLOB NOT NULL, turn INTEGER NOT NULL, model TEXT NOT NULL, "
    "usage TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS docs (rowid INTEGER PRIMARY KEY, sid TEXT NOT NULL, "
    "seq INTEGER NOT NULL, turn INTEGER NOT NULL, kind TEXT NOT NULL, name TEXT)",
    "CREATE INDEX IF NOT EXISTS docs_sid ON docs (sid, seq)",
)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, stamp TEXT NOT NULL, state TEXT NOT NULL, agent TEXT NOT NULL,
    model TEXT NOT NULL, started TEXT NOT NULL, turns INTEGER NOT NULL,
    first_prompt TEXT NOT NULL, parent TEXT, error TEXT, cwd TEXT, forked_from TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_agent ON sessions (agent, id);
CREATE INDEX IF NOT EXISTS sessions_unsettled ON sessions (id) WHERE state != 'ok';
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
""" + "".join(f"{s};\n" for s in _TEXT_SCHEMA)
_COLUMNS = ("id, stamp, state, agent, model, started, turns, first_prompt, parent, error, cwd, "
            "forked_from")
_ROW = "(" + ", ".join("?" * 12) + ")"

_FTS = ("CREATE VIRTUAL TABLE IF NOT EXISTS texts USING fts5(body, "
        "tokenize = 'unicode61 remove_diacritics 0')")
_fts5: list[bool] = []


def fts5_available() -> bool:
    """Whether this Python's SQLite has the FTS5 extension (asked once per process)."""
    if not _fts5:
        try:
            probe = sqlite3.connect(":memory:")
            try:
                probe.execute("CREATE VIRTUAL TABLE temp.probe USING fts5(x)")
                _fts5.append(True)
            finally:
                probe.close()
        except sqlite3.Error:
            _fts5.append(False)
    return _fts5[0]


def _ensure_texts(conn: sqlite3.Connection) -> bool:
    """Whether the index has its full-text table; made here when SQLite has FTS5 (what was
    read before, by a Python without FTS5, is read again into it)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'texts'").fetchone():
        return fts5_available()
    if not fts5_available():
        return False
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(_FTS)
        conn.execute("DELETE FROM reads")
        conn.execute("DELETE FROM docs")
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    return True


#: A row's stamp when its file cannot change what it says (an id that is not a valid one).
PERMANENT = "permanent"
_warned: list[str] = []


class IndexUnusable(Exception):
    """The index cannot be used for this listing (locked, or damaged past a rebuild)."""


def warn_once(message: str) -> None:
    """One ``dsh: warning:`` line per process: an index problem never fails a listing."""
    if _warned:
        return
    _warned.append(message)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"dsh: warning: {message}\n")
        sys.stderr.flush()


def stamp_of(path: Path) -> str | None:
    """``size:mtime_ns:inode`` of a ledger file (of the link itself, for a symbolic link:
    never of what it points to), None when there is none."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def inside(sid: Any) -> bool:
    """Whether a row's id can name a file directly in the sessions folder: a string with no
    ``/`` and no NUL. Every name the folder lists is one; a forged row's ``../x`` or
    ``/elsewhere/x`` is not (``folder / "/elsewhere/x.jsonl"`` would be that path)."""
    return type(sid) is str and "/" not in sid and "\0" not in sid


#: The reason recorded for a ``*.jsonl`` name that is a symbolic link.
SYMLINK = "is a symbolic link, not a session ledger file (not followed)"


def _escaped(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class SessionIndex:
    """The index of one :class:`~dsh.ledger.store.JsonlStore`'s folder."""

    def __init__(self, store: JsonlStore) -> None:
        self.store = store
        self.folder = store.directory / ".index"
        self.path = self.folder / "sessions.sqlite3"
        self._conn: sqlite3.Connection | None = None
        # one store may be listed from several threads: its connection's transactions must
        # not interleave (another store object, like another process, has its own)
        self._lock = threading.RLock()
        #: Whether the index holds the full-text table (:mod:`dsh.ledger.search`).
        self.fts = False

    # --- connection, schema, damage ------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        self.folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        conn = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, VERSION):
                raise sqlite3.DatabaseError(f"index version {version}, not {VERSION}")
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                # readers never wait for a writer; a maker that loses the race to switch it
                # (busy) works in the default mode this once
                with contextlib.suppress(sqlite3.OperationalError):
                    conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            if version == 0:  # new (or emptied): idempotent, so two makers agree
                conn.executescript(_SCHEMA + f"PRAGMA user_version = {VERSION};")
            # a table of the right name but another shape fails here, not half way through
            conn.execute(f"SELECT {_COLUMNS} FROM sessions LIMIT 0")
            conn.execute("SELECT key, value FROM meta LIMIT 0")
            conn.execute("SELECT id, stamp, offset, tail, turn, model, usage FROM reads LIMIT 0")
            conn.execute("SELECT rowid, sid, seq, turn, kind, name FROM docs LIMIT 0")
            self.fts = _ensure_texts(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def _discard(self) -> None:
        """Delete the index files (a damaged index): the next connection starts empty."""
        self.close()
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def _guarded(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``work`` on the index; a damaged index is rebuilt once, a locked or still
        damaged one raises :class:`IndexUnusable`."""
        with self._lock:
            return self._guarded_locked(work)

    def _guarded_locked(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        for attempt in (1, 2):
            try:
                conn = self._connect()
                if attempt == 2:  # rebuilt: fill it before it answers
                    self._sync_names(conn)
                return work(conn)
            except sqlite3.OperationalError as exc:
                if _is_busy(exc):
                    self.close()
                    raise IndexUnusable(f"{self.path} is locked by another process") from None
                damage: Exception = exc
            except (sqlite3.Error, ValueError, TypeError, IndexError) as exc:
                damage = exc
            except OSError as exc:
                self.close()
                raise IndexUnusable(f"{self.path}: {_reason(exc)}") from None
            if attempt == 2:
                self.close()
                raise IndexUnusable(f"{self.path}: {damage}")
            try:
                self._discard()
            except OSError as exc:
                raise IndexUnusable(f"{self.path}: cannot rebuild: {_reason(exc)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    # --- keeping it true -------------------------------------------------------------------

    def _summarise(self, sid: str) -> tuple[Any, ...]:
        """A row for ledger ``sid``, read from the ledger (its stamp taken first, so that a
        line appended meanwhile moves the stamp and is read next time)."""
        try:
            path = self.store.path(sid)
        except UsageError as exc:
            return (_escaped(sid), PERMANENT, "error", "", "", "", 0, "", None, str(exc), None,
                    None)
        stamp = stamp_of(path) or "missing"
        if not _plain(path) and os.path.lexists(path):
            # read through, it would list (and show) a file outside the folder
            return (sid, stamp, "error", "", "", "", 0, "", None, f"{path} {SYMLINK}", None,
                    None)
        try:
            info, settled = self.store.summary(sid)
        except (LedgerError, UsageError) as exc:
            return (sid, stamp, "error", "", "", "", 0, "", None, str(exc), None, None)
        return (sid, stamp, "ok" if settled else "open", info.agent, info.model, info.started,
                info.turns, info.first_prompt, info.parent, None, getattr(info, "cwd", None),
                getattr(info, "forked_from", None))

    def _sync_names(self, conn: sqlite3.Connection) -> None:
        """Bring the rows in line with the folder's names when the folder changed."""
        directory = self.store.directory
        st = os.stat(directory)
        sig = f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}"
        row = conn.execute("SELECT value FROM meta WHERE key = 'folder'").fetchone()
        if row is not None and row[0] == sig:
            return
        try:
            names = os.listdir(directory)
        except OSError as exc:
            raise LedgerError(f"cannot list sessions in {directory}: {_reason(exc)}") from None
        # racy: a file made in the clock tick of the mtime, after this listing, would not
        # move it; such a signature is not kept (judged now, not after the reading below)
        racy = time.time() - st.st_mtime_ns / 1e9 < (RACY if st.st_mtime_ns % 10**9 == 0
                                                      else RACY_FINE)
        ids = {n[:-6] for n in names if n[-6:] == ".jsonl"}
        known = {r for (r,) in conn.execute("SELECT id FROM sessions")}
        new = ids - known
        gone = known - ids
        if gone:  # a name that is not UTF-8 has its escaped form for id: not gone
            gone -= {_escaped(i) for i in new}
        rows = [self._summarise(sid) for sid in new]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("DELETE FROM sessions WHERE id = ?", ((g,) for g in gone))
            conn.executemany(f"INSERT OR REPLACE INTO sessions ({_COLUMNS}) VALUES {_ROW}",
                             rows)
            conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('folder', ?)",
                         (None if racy else sig,))
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def _update(self, conn: sqlite3.Connection, rows: list[tuple[Any, ...]],
                gone: list[str]) -> None:
        if not rows and not gone:
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("DELETE FROM sessions WHERE id = ?", ((g,) for g in gone))
            conn.executemany(f"INSERT OR REPLACE INTO sessions ({_COLUMNS}) VALUES {_ROW}",
                             rows)
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def _fresh(self, row: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """``row`` if its ledger has not moved since, else the ledger's row now (None: gone)."""
        sid, stamp = row[0], row[1]
        if not inside(sid):  # a forged row: nothing outside the folder is looked at
            return None
        if stamp == PERMANENT and row[2] == "error" and _well_typed(row):
            return row
        now = stamp_of(self.store.directory / f"{sid}.jsonl")
        if now is None:
            return None
        if now == stamp and _well_typed(row):
            return row
        return self._summarise(sid)

    def refresh(self) -> list[tuple[Any, ...]]:
        """Make the index agree with the folder; the rows that cannot be listed (errors),
        newest first."""
        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            self._sync_names(conn)
            unsettled = conn.execute(f"SELECT {_COLUMNS} FROM sessions WHERE state != 'ok' "
                                     "ORDER BY id DESC").fetchall()
            rows, gone, errors = [], [], []
            for row in unsettled:
                fresh = self._fresh(row)
                if fresh is None:
                    gone.append(row[0])
                    continue
                if fresh is not row:
                    rows.append(fresh)
                if fresh[2] == "error":
                    errors.append(fresh)
            self._update(conn, rows, gone)
            return errors

        result: list[tuple[Any, ...]] = self._guarded(work)
        return result

    def rebuild(self) -> int:
        """Delete the index and make it again from every ledger; the number of rows."""
        with self._lock:
            self._discard()
        self.refresh()
        return int(self._guarded(lambda c: c.execute("SELECT count(*) FROM sessions")
                                 .fetchone()[0]))

    # --- reading ---------------------------------------------------------------------------

    def sessions(self, on_skip: Callable[[Path, str], None] | None = None, *,
                 agent: str | None = None, roots: bool = False) -> Iterator[SessionInfo]:
        """Every listable session (of ``agent``; only those without a parent with
        ``roots``), newest first, each checked against its ledger as it is yielded. The
        ledgers that cannot be listed are reported to ``on_skip`` first."""
        for row in self.refresh():
            if on_skip is not None:
                on_skip(self.store.directory / f"{row[0]}.jsonl", str(row[9]))
        where = "state != 'error'" + (" AND agent = ?" if agent is not None else "") + (
            " AND parent IS NULL" if roots else "")
        args: tuple[Any, ...] = (agent,) if agent is not None else ()
        last: str | None = None
        while True:
            query = (f"SELECT {_COLUMNS} FROM sessions WHERE {where}"
                     + (" AND id < ?" if last is not None else "")
                     + f" ORDER BY id DESC LIMIT {PAGE}")
            params = args + ((last,) if last is not None else ())
            page = self._guarded(partial(_fetch, query=query, params=params))
            if not page:
                return
            for row in page:
                last = row[0]
                fresh = self._fresh(row)
                if fresh is not row:
                    changed = [fresh] if fresh is not None else []
                    dropped = [] if fresh is not None else [row[0]]
                    self._guarded(partial(self._update, rows=changed, gone=dropped))
                if fresh is None:
                    continue
                if fresh[2] == "error":
                    if on_skip is not None:
                        on_skip(self.store.directory / f"{fresh[0]}.jsonl", str(fresh[9]))
                    continue
                if (agent is not None and fresh[3] != agent) or (roots and fresh[8]):
                    continue
                yield info_of(fresh, self.store.directory)

    def matching(self, prefix: str) -> list[str]:
        """The ids that start with ``prefix`` (whose ledgers are there), newest first."""
        self.refresh()
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix and ord(prefix[-1]) < 0x10FFFF \
            else None
        rows = self._guarded(lambda c: c.execute(
            "SELECT id FROM sessions WHERE id >= ?" + (" AND id < ?" if upper else "")
            + " AND stamp != ? ORDER BY id DESC", (prefix, upper, PERMANENT) if upper
            else (prefix, PERMANENT)).fetchall())
        return [r[0] for r in rows if inside(r[0]) and r[0].startswith(prefix)
                and _plain(self.store.directory / f"{r[0]}.jsonl")]


def info_of(row: tuple[Any, ...], directory: Path) -> SessionInfo:
    """The :class:`~dsh.ledger.store.SessionInfo` of a well-typed row."""
    from dsh.ledger.store import SessionInfo

    return SessionInfo(id=row[0], path=directory / f"{row[0]}.jsonl", agent=row[3],
                       model=row[4], started=row[5], turns=row[6], first_prompt=row[7],
                       parent=row[8], cwd=row[10], forked_from=row[11])


def _plain(path: Path) -> bool:
    """Whether ``path`` exists and is not a symbolic link."""
    try:
        return not stat.S_ISLNK(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def _fetch(conn: sqlite3.Connection, query: str, params: tuple[Any, ...]) -> list[Any]:
    return conn.execute(query, params).fetchall()


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _well_typed(row: tuple[Any, ...]) -> bool:
    """A row as this module writes it (a hand-edited one is summarised again)."""
    return (len(row) == 12 and all(type(v) is str for v in row[:6]) and type(row[6]) is int
            and type(row[7]) is str and all(v is None or type(v) is str for v in row[8:])
            and row[2] in ("ok", "open", "error"))
