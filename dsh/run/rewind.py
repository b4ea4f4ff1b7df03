"""Rewind a session: a fork at an earlier turn (:mod:`dsh.ledger.fork`), and the files.

A **rewind** is a fork at an earlier turn and, with ``files``, the workspace put back as it
was then: each change recorded by a ``tool/result`` after that turn (and by the sub-agents
those calls ran) is undone, newest first, from its recorded diff (:func:`dsh.tools.changes.undo`).
Every file is checked before any is written: one whose content is not what dsh last wrote
(edited, deleted or renamed by hand since), or whose change was recorded without its whole
diff, refuses the rewind, naming the file — nothing is restored and no fork is made. Files are
written through :mod:`dsh.core.beneath`, each beneath the working directory recorded for the
turn that changed it (a session resumed in another folder changed files there).

The records are untrusted (a plugin's, a hand-edited file): a path is refused when it leaves
the folder, names a persistence path (``.git``, ``.mcp.json``… — dsh-shell never writes them)
or the sessions folder; a record whose ``op`` contradicts its digests, or an ``add`` whose
diff is not the whole file, refuses; a sub-agent session named twice (a cycle), missing or
nested too deep refuses rather than being skipped. Each file is read again just before it is
written: one changed meanwhile, or a write that fails, puts back the files already written
and removes the fork.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import Any

import attrs

from dsh.core.errors import LedgerError
from dsh.core.errors import UsageError
from dsh.core.messages import Change
from dsh.ledger.events import Event
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnStarted
from dsh.ledger.fork import history_end
from dsh.ledger.fork import fork

__all__ = ["Rewound", "rewind"]


@attrs.frozen
class Rewound:
    """What :func:`rewind` did: the new session, and each file put back (``(path, what)``:
    ``restored``, ``removed`` — a file a tool created — or ``recreated``)."""

    session: str
    files: tuple[tuple[str, str], ...] = ()
    root: str | None = None


#: How deep sub-agent sessions are followed (dsh.run.subagent.MAX_DEPTH): a deeper one is
#: refused, not skipped (what it changed would be left in place without a word).
MAX_NESTING = 8


def _changes_after(store: Any, events: list[Event], cut: int, cwd: str | None,
                   seen: set[str], depth: int = 0) -> Iterator[tuple[Change, int, str | None]]:
    """Every change recorded after line ``cut`` of ``events``, oldest first, with its turn and
    the working directory that turn ran in (the last ``cwd`` recorded up to it: a session
    resumed elsewhere changed files there); a sub-agent call's changes (its child session's,
    read recursively) come before the call's own result, and a call that never returned (a
    crash) still has its child's. A child named twice (a cycle, ``seen``), missing or too
    deep refuses the rewind."""
    turn = 0
    children: dict[str, str] = {}

    def child_changes(child: str) -> Iterator[tuple[Change, int, str | None]]:
        why = ("is named more than once (a cycle?)" if child in seen
               else "is nested too deep" if depth + 1 > MAX_NESTING else "")
        if not why:
            seen.add(child)
            try:
                child_events = store.read(child)
            except (UsageError, LedgerError) as exc:
                why = f"cannot be read ({exc})"
        if why:
            raise UsageError(f"cannot rewind the files: the sub-agent session {child} of "
                             f"turn {turn} {why}, so what it changed is unknown; nothing was "
                             "restored")
        for change, _, where in _changes_after(store, child_events, 0, cwd, seen, depth + 1):
            yield change, turn, where

    for i, e in enumerate(events):
        if type(e) is TurnStarted:
            turn = e.turn
            if isinstance(e.cwd, str) and e.cwd:
                cwd = e.cwd
        if i < cut:
            continue
        if type(e) is ToolCalled and e.child_session:
            children[e.call_id] = e.child_session
        elif type(e) is ToolReturned:
            child = children.pop(e.call_id, None)
            if child is not None:
                yield from child_changes(child)
            for change in e.changes:
                yield change, turn, cwd
    for child in children.values():  # a call that never returned: its child wrote files too
        yield from child_changes(child)


_LIES = "the record does not hold together"
_Key = tuple[str, str]  # (root, the path relative to it, spelled one way)


def _fold(part: str) -> str:
    import unicodedata

    part = "".join(c for c in part if unicodedata.category(c) != "Cf")
    return unicodedata.normalize("NFKC", part).casefold().rstrip(" .")


def _key(root: str, path: str, turn: int, store_dir: str) -> _Key:
    """``path`` of a change record (untrusted) as one spelling beneath ``root``; refused when
    it is absolute, has ``..`` or a NUL, is a persistence path (``.git``, ``.mcp.json``…: git
    and dsh obey them, and dsh-shell never writes them) or lies in the sessions folder."""
    from dsh.core import beneath

    try:
        parts = beneath.parts_of(path)
        if not parts:
            raise beneath.Refused("it is the folder itself, not a file")
    except beneath.Refused as exc:
        raise UsageError(f"cannot rewind {path!r} (changed in turn {turn}): {exc}; nothing "
                         "was restored") from None
    rel = "/".join(parts)
    real = os.path.join(os.path.realpath(root), rel)  # no link on the way: beneath refuses
    if _fold(parts[0]) in {_fold(p) for p in beneath.PERSISTENCE}:
        why = "it is a file that shapes later runs (git, dsh obey it): restore it yourself"
    elif beneath.within(real, store_dir):
        why = "it is in dsh's sessions folder"
    elif beneath.protected_by(real) is not None:
        why = f"it is one of dsh's protected paths ({beneath.protected_by(real)})"
    else:
        return root, rel
    raise UsageError(f"cannot rewind {rel} (changed in turn {turn}): {why}; nothing was "
                     "restored")


def _consistent(change: Change) -> bool:
    """Whether the record's ``op`` agrees with its digests and its new name."""
    b, a, m = change.before_sha256, change.after_sha256, change.moved_to
    if change.op == "move":
        return m is not None and b is not None and a is not None
    return m is None and {"add": b is None and a is not None,
                          "delete": b is not None and a is None,
                          "update": b is not None and a is not None}.get(change.op, False)


def _plan(changes: list[tuple[Change, int, str]], store_dir: str
          ) -> tuple[dict[_Key, bytes | None], dict[_Key, bytes | None]]:
    """The content each changed path must get back (``None``: removed), checked against the
    disk before anything is written, and what each holds now. :class:`UsageError` names the
    first file that cannot be put back."""
    from dsh.core import beneath
    from dsh.tools.changes import DiffMismatch
    from dsh.tools.changes import apply_diff
    from dsh.tools.changes import undo

    state: dict[_Key, bytes | None] = {}
    disk: dict[_Key, bytes | None] = {}

    def now(key: _Key) -> bytes | None:
        if key not in state:
            try:
                state[key] = beneath.read(*key)
            except FileNotFoundError:
                state[key] = None
            except OSError as exc:
                raise UsageError(f"cannot rewind {key[1]}: {exc.strerror or exc}") from None
            disk[key] = state[key]
        return state[key]

    for change, turn, root in reversed(changes):
        old = _key(root, change.path, turn, store_dir)
        key = _key(root, change.moved_to, turn, store_dir) if change.moved_to else old
        where = key[1]
        try:
            if not _consistent(change) or (change.op == "move" and key == old):
                raise DiffMismatch(_LIES)
            current = now(key)
            before = undo(change, current)
            if change.op == "add" and apply_diff(change.diff, (current or b"").decode(),
                                                 reverse=True):
                raise DiffMismatch(_LIES)  # the diff does not make the whole file
        except (DiffMismatch, UnicodeDecodeError) as exc:
            hint = ("its record does not hold together (op, digests, diff)"
                    if isinstance(exc, UnicodeDecodeError) or str(exc) == _LIES
                    else "its change was recorded without its whole diff" if not change.complete
                    else "it is not there any more" if now(key) is None
                    else "its content is not what dsh left there (changed since?)")
            raise UsageError(f"cannot rewind {where} (changed in turn {turn}): {hint}; "
                             "nothing was restored") from None
        if change.op == "move":
            if now(old) is not None:
                raise UsageError(f"cannot rewind {old[1]} (moved to {where} in turn "
                                 f"{turn}): a file of that name exists again; nothing was "
                                 "restored")
            state[key] = None
        state[old] = before
    kept = [k for k, d in state.items() if d is not None]
    folders = {(r, p[:i]) for r, p in kept for i, c in enumerate(p) if c == "/"}
    for root, rel in kept:  # a file and a folder of one name cannot both be put back
        if (root, rel) in folders:
            raise UsageError(f"cannot rewind {rel}: the records want it both as a file and "
                             "as a folder; nothing was restored")
    return {k: d for k, d in state.items() if d != disk[k]}, disk


def rewind(store: Any, session_id: str, *, to: int, files: bool = False,
           root: str | None = None, dry_run: bool = False) -> Rewound:
    """Fork ``session_id`` after turn ``to`` and, with ``files``, restore the workspace files
    its recorded changes after that turn touched (every one beneath ``root`` when given; by
    default each beneath the working directory its turn recorded, else the current one). With
    ``dry_run`` nothing is written: the result names the files that would be put back (a path
    beneath another folder than the session's last, whole) and no session."""
    events = store.read(session_id)
    cut = history_end(events, to, session_id)
    plan: dict[_Key, bytes | None] = {}
    disk: dict[_Key, bytes | None] = {}
    if files:
        here = os.path.realpath(root or _recorded_cwd(events) or os.getcwd())
        changes = [(c, t, here if root or not cwd else os.path.realpath(cwd)) for c, t, cwd
                   in _changes_after(store, events, cut, None, {session_id})]
        plan, disk = _plan(changes, os.path.realpath(store.directory))
        root = here
    what = tuple((rel if where == root else os.path.join(where, rel),
                  "removed" if data is None else
                  "recreated" if disk.get((where, rel)) is None else "restored")
                 for (where, rel), data in plan.items())
    if dry_run:
        return Rewound("", what, root)
    new = fork(store, session_id, at=to, reason="rewind")
    try:
        _write(plan, disk)
    except BaseException:
        with contextlib.suppress(OSError):  # nothing restored: no fork either
            store.path(new).unlink()
        raise
    return Rewound(new, what, root)


def _recorded_cwd(events: list[Event]) -> str | None:
    """The working directory the session last recorded (where its latest turn ran)."""
    for e in reversed(events):
        cwd = e.cwd if type(e) is TurnStarted else None
        if isinstance(cwd, str) and cwd:
            return cwd
    return None


def _write(plan: dict[_Key, bytes | None], disk: dict[_Key, bytes | None]) -> None:
    """Put each planned content in place (removals last, so a moved file is written back
    before its new name goes), each file read again just before: one changed since the check
    (a race), or a write that fails, puts back the files already written and refuses."""
    from dsh.core import beneath

    done: list[tuple[_Key, int]] = []
    order = sorted(plan, key=lambda k: plan[k] is None)
    key = order[0] if order else ("", "")
    try:
        for key in order:
            try:
                now: bytes | None = beneath.read(*key)
            except FileNotFoundError:
                now = None
            if now != disk[key]:
                raise UsageError(f"cannot restore {key[1]}: it changed while the rewind ran")
            data = plan[key]
            if data is None:
                done.append((key, stat.S_IMODE(beneath.remove(*key).st_mode)))
            else:
                old = beneath.write(*key, data, create_dirs=True)
                done.append((key, 0o666 if old is None else stat.S_IMODE(old.st_mode)))
    except BaseException as exc:
        for (where, rel), mode in reversed(done):
            with contextlib.suppress(OSError):
                old_data = disk[(where, rel)]
                if old_data is None:
                    beneath.remove(where, rel)
                else:
                    beneath.write(where, rel, old_data, create_dirs=True, mode=mode)
        if not isinstance(exc, (OSError, UsageError)):
            raise
        why = str(exc) if isinstance(exc, UsageError) else (
            f"cannot restore {key[1]}: {exc.strerror or exc}")
        raise UsageError(f"{why}; nothing was restored (the files written before it were "
                         "put back)") from None
