"""Every change a tool makes is a diff in the ledger (docs/plugins.md, "Recording a change").

A tool that writes a file calls :func:`record` with the file's bytes before and after. The
:class:`~dsh.core.messages.Change` it builds — the unified diff, lines added and removed, the
digests of both contents — is kept by the tool call and written with its ``tool/result``
(``changes``), so rewind, replay, ``dsh sessions show``, the HTML page, ``dsh chat`` and ACP
render or apply what was recorded, never a re-read of the disk. :func:`for_model` is the
bounded text of the diffs a tool returns to the model.

The diff is exact: each line keeps its own ending (``\\r\\n`` stays ``\\r\\n``), a last line
without a newline is marked ``\\ No newline at end of file`` as ``diff`` and ``patch`` do,
and a content that is not UTF-8 text (a NUL byte, an invalid sequence) is recorded as
``Binary files differ`` with ``complete`` false.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from collections.abc import Sequence

from dsh.core.messages import Change

__all__ = ["MAX_RECORDED", "Change", "DiffMismatch", "apply_diff", "diff_of", "for_model",
           "record", "undo"]

#: Characters of one change's diff kept in the ledger; a longer diff keeps its start and is
#: marked incomplete (``complete`` false: a rewind of it is refused, not guessed).
MAX_RECORDED = 1 << 20
#: Lines of diff :func:`for_model` returns by default.
MODEL_LINES = 80
_LINE = re.compile(r"[^\n]*\n|[^\n]+$")
_NO_NEWLINE = "\\ No newline at end of file\n"


def _digest(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _text(data: bytes | None) -> str | None:
    """The content as text, ``""`` for a missing file, ``None`` when it is not text."""
    if data is None:
        return ""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _lines(text: str) -> list[str]:
    """Lines with their own endings (only ``\\n`` ends a line: ``str.splitlines`` would also
    split at form feeds and Unicode separators, which ``patch`` does not)."""
    return _LINE.findall(text)


def diff_of(before: str, after: str, path: str, *, new_path: str | None = None,
            context: int = 3, created: bool = False, deleted: bool = False) -> str:
    """The unified diff from ``before`` to ``after`` (both text), ``""`` when equal."""
    import difflib  # only when something changed

    a, b = _lines(before), _lines(after)
    old_name = "/dev/null" if created else f"a/{path}"
    new_name = "/dev/null" if deleted else f"b/{new_path or path}"
    out: list[str] = []
    for line in difflib.unified_diff(a, b, old_name, new_name, n=context):
        if not line.endswith("\n"):
            line = f"{line}\n{_NO_NEWLINE}"
        out.append(line)
    return "".join(out)


def _counts(diff: str) -> tuple[int, int]:
    added = removed = 0
    for line in diff.splitlines():
        if line.startswith("+") and not line.startswith("+++ "):
            added += 1
        elif line.startswith("-") and not line.startswith("--- "):
            removed += 1
    return added, removed


def record(path: str, before: bytes | None, after: bytes | None, *,
           moved_to: str | None = None, unread: int | None = None) -> Change:
    """Record that the current tool call changed ``path`` from ``before`` to ``after``
    (``None``: the file did not exist / no longer exists); return the change.

    ``moved_to`` names the new path of a move; ``unread`` is the size of an old content too
    large to have been read (the change is then recorded without its diff, incomplete). Inside a tool call the change is written with
    the call's ``tool/result``; outside one (a script calling a tool's function) it is only
    returned.
    """
    op = ("move" if moved_to is not None else "add" if before is None and unread is None
          else "delete" if after is None else "update")
    old, new = _text(before), _text(after)
    complete = True
    if unread is not None:
        diff = (f"diff a/{path} b/{moved_to or path}\n(the old content, {unread} bytes, was "
                "too large to diff)\n")
        added = removed = 0
        complete = False
    elif old is None or new is None:
        diff = (f"diff a/{path} b/{moved_to or path}\nBinary files differ "
                f"({0 if before is None else len(before)} -> "
                f"{0 if after is None else len(after)} bytes)\n")
        added = removed = 0
        complete = False
    else:
        diff = diff_of(old, new, path, new_path=moved_to, created=before is None,
                       deleted=after is None)
        added, removed = _counts(diff)
        if len(diff) > MAX_RECORDED:
            cut = diff.rfind("\n", 0, MAX_RECORDED) + 1
            diff = diff[:cut]
            complete = False
    change = Change(path=path, op=op, diff=diff, added=added, removed=removed,
                    moved_to=moved_to, before_sha256=_digest(before),
                    after_sha256=_digest(after), complete=complete)
    from dsh.tools.registry import current_call

    try:
        call = current_call()
    except LookupError:
        return change
    call.changes.append(change)
    return change


def for_model(changes: Iterable[Change], max_lines: int = MODEL_LINES) -> str:
    """The diffs of ``changes`` as the model reads them after a write: at most ``max_lines``
    lines, with a note saying how many were left out (the whole diff stays recorded)."""
    lines: list[str] = []
    for c in changes:
        lines.extend(c.diff.splitlines())
    if len(lines) <= max_lines:
        return "\n".join(lines)
    left = len(lines) - max_lines
    return "\n".join([*lines[:max_lines], f"[diff cut: {left} more lines not shown; "
                                          "read the file to see the rest]"])


def totals(changes: Sequence[Change]) -> tuple[int, int, int]:
    """Files changed, lines added, lines removed (what a trace or a summary shows)."""
    return len(changes), sum(c.added for c in changes), sum(c.removed for c in changes)


class DiffMismatch(ValueError):
    """A recorded diff does not fit the text it is applied to (the file changed since)."""


_HUNK = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_diff(diff: str, text: str, *, reverse: bool = False) -> str:
    """``text`` with the unified ``diff`` applied (``reverse``: undone), every context and
    removed line checked exactly; :class:`DiffMismatch` names the first line that differs.

    The inverse of :func:`diff_of`: ``apply_diff(diff_of(a, b, p), a) == b`` and
    ``apply_diff(diff_of(a, b, p), b, reverse=True) == a`` (tests/test_changes.py checks
    both, and that ``patch`` agrees). What rewind uses; it never guesses at fuzz.
    """
    lines = _lines(text)
    out: list[str] = []
    pos = 0  # index in ``lines`` of the next line not yet copied
    rows = _lines(diff)
    i = 0
    while i < len(rows):
        m = _HUNK.match(rows[i])
        i += 1
        if m is None:
            continue  # headers (---, +++, diff …) and anything before the first hunk
        start = int(m.group(3) if reverse else m.group(1))
        start = max(start - 1, 0) if int((m.group(4) if reverse else m.group(2)) or 1) else start
        if start < pos or start > len(lines):
            raise DiffMismatch(f"hunk {m.group(0)} does not fit: the text has {len(lines)} lines")
        out.extend(lines[pos:start])
        pos = start
        old_sign, new_sign = ("+", "-") if reverse else ("-", "+")
        while i < len(rows) and not rows[i].startswith("@@"):
            row = rows[i]
            i += 1
            sign, body = row[:1], row[1:]
            if i < len(rows) and rows[i] == _NO_NEWLINE:
                body = body[:-1] if body.endswith("\n") else body
                i += 1
            if sign == " " or sign == old_sign:
                if pos >= len(lines) or lines[pos] != body:
                    raise DiffMismatch(f"line {pos + 1} is not what the diff expects: "
                                       f"{body[:60]!r}")
                pos += 1
                if sign == " ":
                    out.append(body)
            elif sign == new_sign:
                out.append(body)
            elif row.startswith(("--- ", "+++ ", "diff ")):
                i -= 1
                break
    out.extend(lines[pos:])
    return "".join(out)


def undo(change: Change, current: bytes | None) -> bytes | None:
    """The content ``change`` replaced, from ``current`` (the file now; ``None``: missing):
    what rewind writes back. :class:`DiffMismatch` when ``current`` is not what the change
    left (its digest differs) or the change was recorded incomplete."""
    if _digest(current) != change.after_sha256:
        raise DiffMismatch(f"{change.moved_to or change.path} changed since the tool wrote it")
    if not change.complete:
        raise DiffMismatch(f"the change to {change.path} was recorded without its whole diff")
    if change.op == "add":
        return None
    text = (current or b"").decode("utf-8")
    before = apply_diff(change.diff, text, reverse=True).encode("utf-8")
    if _digest(before) != change.before_sha256:
        raise DiffMismatch(f"undoing the diff of {change.path} does not give its old content")
    return before
