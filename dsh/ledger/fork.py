"""Sessions form a tree: fork a session at a turn, and rewind one with the files it changed.

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

A **rewind** is a fork at an earlier turn and, with ``files``, the workspace put back as it
was then: each change recorded by a ``tool/result`` after that turn (and by the sub-agents
those calls ran) is undone, newest first, from its recorded diff (:func:`dsh.tools.changes.undo`).
Every file is checked before any is written: one whose content is not what dsh last wrote
(edited, deleted or renamed by hand since), or whose change was recorded without its whole
diff, refuses the rewind, naming the file — nothing is restored and no fork is made. Files are
written through :mod:`dsh.core.beneath`, beneath the session's recorded working directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import attrs

from dsh.core.errors import LedgerError
from dsh.core.errors import UsageError
from dsh.core.messages import Change
from dsh.ledger.events import Event
from dsh.ledger.events import SessionForked
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnStarted

__all__ = ["Rewound", "fork", "rewind", "turns_of"]


def turns_of(events: list[Event]) -> int:
    """The number of the last turn in ``events`` (0: none)."""
    last = 0
    for e in events:
        if type(e) is TurnStarted:
            last = max(last, e.turn)
    return last


def _cut(events: list[Event], at: int | None, session: str) -> int:
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
    cut = _cut(events, at, session_id)
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


# -- rewind -------------------------------------------------------------------------------------


@attrs.frozen
class Rewound:
    """What :func:`rewind` did: the new session, and each file put back (``(path, what)``:
    ``restored``, ``removed`` — a file a tool created — or ``recreated``)."""

    session: str
    files: tuple[tuple[str, str], ...] = ()
    root: str | None = None


def _changes_after(store: Any, events: list[Event], cut: int, depth: int = 0
                   ) -> Iterator[tuple[Change, int]]:
    """Every change recorded after line ``cut`` of ``events``, oldest first, with its turn; a
    sub-agent call's changes (its child session's, read recursively) come before the call's
    own result."""
    turn = 0
    children: dict[str, str] = {}
    for i, e in enumerate(events):
        if type(e) is TurnStarted:
            turn = e.turn
        if i < cut:
            continue
        if type(e) is ToolCalled and e.child_session and depth < 8:
            children[e.call_id] = e.child_session
        elif type(e) is ToolReturned:
            child = children.pop(e.call_id, None)
            if child is not None:
                try:
                    child_events = store.read(child)
                except (UsageError, LedgerError) as exc:
                    raise UsageError(f"cannot rewind the files: the sub-agent session {child} "
                                     f"of turn {turn} cannot be read ({exc}), so what it "
                                     "changed is unknown; nothing was restored") from None
                for change, _ in _changes_after(store, child_events, 0, depth + 1):
                    yield change, turn
            for change in e.changes:
                yield change, turn


def _plan(root: str, changes: list[tuple[Change, int]]
          ) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """The content each changed path must get back (``None``: removed), checked against the
    disk before anything is written, and what each holds now. :class:`UsageError` names the
    first file that cannot be put back."""
    from dsh.core import beneath
    from dsh.tools.changes import DiffMismatch
    from dsh.tools.changes import undo

    state: dict[str, bytes | None] = {}
    disk: dict[str, bytes | None] = {}

    def now(path: str) -> bytes | None:
        if path not in state:
            try:
                state[path] = beneath.read(root, path)
            except FileNotFoundError:
                state[path] = None
            except OSError as exc:
                raise UsageError(f"cannot rewind {path}: {exc.strerror or exc}") from None
            disk[path] = state[path]
        return state[path]

    for change, turn in reversed(changes):
        where = change.moved_to or change.path
        try:
            before = undo(change, now(where))
        except DiffMismatch:
            hint = ("its change was recorded without its whole diff" if not change.complete
                    else "it is not there any more" if now(where) is None
                    else "its content is not what dsh left there (changed since?)")
            raise UsageError(f"cannot rewind {where} (changed in turn {turn}): {hint}; "
                             "nothing was restored") from None
        if change.op == "move":
            if now(change.path) is not None:
                raise UsageError(f"cannot rewind {change.path} (moved to {where} in turn "
                                 f"{turn}): a file of that name exists again; nothing was "
                                 "restored")
            state[where] = None
        state[change.path] = before
    return {p: d for p, d in state.items() if d != disk[p]}, disk


def rewind(store: Any, session_id: str, *, to: int, files: bool = False,
           root: str | None = None, dry_run: bool = False) -> Rewound:
    """Fork ``session_id`` after turn ``to`` and, with ``files``, restore the workspace files
    its recorded changes after that turn touched (beneath ``root``, default: the session's
    recorded working directory, else the current one). With ``dry_run`` nothing is written:
    the result names the files that would be put back and no session."""
    events = store.read(session_id)
    cut = _cut(events, to, session_id)
    plan: dict[str, bytes | None] = {}
    disk: dict[str, bytes | None] = {}
    if files:
        root = root or _recorded_cwd(events) or os.getcwd()
        plan, disk = _plan(root, list(_changes_after(store, events, cut)))
    what = tuple((path, "removed" if data is None else
                  "recreated" if disk.get(path) is None else "restored")
                 for path, data in plan.items())
    if dry_run:
        return Rewound("", what, root)
    new = fork(store, session_id, at=to, reason="rewind")
    _write(root or "", plan)
    return Rewound(new, what, root)


def _recorded_cwd(events: list[Event]) -> str | None:
    for e in events:
        cwd = getattr(e, "cwd", None) if type(e) is TurnStarted else None
        if isinstance(cwd, str) and cwd:
            return cwd
    return None


def _write(root: str, plan: dict[str, bytes | None]) -> None:
    """Put each planned content in place (removals last, so a moved file is written back
    before its new name goes)."""
    from dsh.core import beneath

    for path, data in plan.items():
        if data is not None:
            try:
                beneath.write(root, path, data, create_dirs=True)
            except OSError as exc:
                raise UsageError(f"cannot restore {path}: {exc.strerror or exc}") from None
    for path, data in plan.items():
        if data is None:
            try:
                beneath.remove(root, path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise UsageError(f"cannot remove {path}: {exc.strerror or exc}") from None
