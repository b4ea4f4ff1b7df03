"""Sessions form a tree: fork a session at a turn (rewinding is :mod:`dsh.run.rewind`).

A **fork** is a new session whose history is its parent's up to the end of a turn. Its ledger
begins with a ``session/fork`` line naming the parent, the turn and the parent's last line
copied; then come the parent's lines themselves — every one before the next turn's
``turn/start``, so that what happened between two turns (a fact remembered in ``dsh chat``,
a plugin's state) is kept — with ``session`` and ``seq`` renumbered and nothing else touched.
The fork therefore needs nothing from its parent afterwards (the parent may be deleted), and
its next request is byte for byte the one the parent would have sent at that point with the
same new message: the projection folded from the copied lines is the parent's.

Reading the parent takes no lock (:meth:`JsonlStore.read`): a session that a run is writing is
forked from the lines written so far (a torn last line is left out), and a turn left open by
a crash is repaired when the fork is first resumed, as its parent's would be.
"""

from __future__ import annotations

import os
from typing import Any

from dsh.core.errors import LedgerError
from dsh.core.errors import UsageError
from dsh.ledger.events import Event
from dsh.ledger.events import SessionForked
from dsh.ledger.events import TurnStarted

__all__ = ["fork", "history_end", "turns_of"]


def turns_of(events: list[Event]) -> int:
    """The number of the last turn in ``events`` (0: none)."""
    last = 0
    for e in events:
        if type(e) is TurnStarted:
            last = max(last, e.turn)
    return last


def history_end(events: list[Event], at: int | None, session: str) -> int:
    """How many of ``events`` belong to the history up to the end of turn ``at`` (all of
    them when ``at`` is None): every line before the first ``turn/start`` of a later turn."""
    last = turns_of(events)
    if at is None:
        return len(events)
    if at < 0 or at > last:
        raise UsageError(f"session {session} has {last} turn{'s' if last != 1 else ''}: "
                         f"there is no turn {at} to fork at (0 to {last})")
    for i, e in enumerate(events):
        if type(e) is TurnStarted and e.turn > at:
            return i
    return len(events)


def fork(store: Any, session_id: str, *, at: int | None = None, reason: str = "fork",
         new_id: str | None = None) -> str:
    """Fork ``session_id`` (a full id) after its turn ``at`` (default: its last); return the
    new session's id. ``reason`` (``fork``, ``rewind``) is recorded on the ``session/fork``
    line.

    The fork is written whole or not at all: to a hidden file of the sessions folder first,
    made durable, then linked to its name (never replacing one) — a fork killed half-way
    (even by SIGKILL) leaves no half a history behind, only a ``.fork-*.tmp`` file.

    :raises UsageError: no such session, or no such turn (the session's turns are named).
    :raises LedgerError: the parent cannot be read (file and line named)."""
    from dsh.core.files import fsync_dir
    from dsh.core.files import reason as os_reason
    from dsh.ledger.writer import Ledger
    from dsh.ledger.writer import new_session_id

    events = store.read(session_id)
    cut = history_end(events, at, session_id)
    copied = events[:cut]
    new_id = new_id or new_session_id()
    final = store.path(new_id)
    tmp = final.with_name(f".fork-{new_id}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC,
                     0o600)
    except OSError as exc:
        raise LedgerError(f"cannot write the fork {tmp}: {os_reason(exc)}") from None
    ledger = Ledger(new_id, tmp, fd=fd, fsync="never")
    try:
        ledger.adopt(SessionForked(parent=session_id, turn=turns_of(copied),
                                   parent_seq=copied[-1].seq if copied else -1, reason=reason))
        for event in copied:
            ledger.adopt(event)
        os.fsync(fd)
        try:
            os.link(tmp, final)
        except FileExistsError:
            raise UsageError(f"session {new_id} already exists ({final})") from None
        except OSError as exc:
            raise LedgerError(f"cannot write the fork {final}: {os_reason(exc)}") from None
        fsync_dir(final.parent)
    finally:
        ledger.close()
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return new_id
