"""Every change a tool makes is a diff in the ledger (docs/plugin-tools.md, "Recording the
files a tool changes").

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
import json
import re
from collections.abc import Iterable
from collections.abc import Sequence
from typing import Any

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
    """The unified diff from ``before`` to ``after`` (both text), ``""`` when equal. A name
    with a control character, a quote or a backslash is quoted as git quotes it, so a file
    name cannot add lines to the diff. The time is bounded (:data:`MAX_DIFF_WORK`)."""
    a, b = _lines(before), _lines(after)
    if a == b:
        return ""
    old_name = "/dev/null" if created else _quote(f"a/{path}")
    new_name = "/dev/null" if deleted else _quote(f"b/{new_path or path}")
    out = [f"--- {old_name}\n", f"+++ {new_name}\n"]
    for group in _grouped(a, b, context):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            for sign, rows in ((" ", a[i1:i2] if tag == "equal" else ()),
                               ("-", a[i1:i2] if tag in ("replace", "delete") else ()),
                               ("+", b[j1:j2] if tag in ("replace", "insert") else ())):
                out.extend(f"{sign}{line}" if line.endswith("\n")
                           else f"{sign}{line}\n{_NO_NEWLINE}" for line in rows)
    return "".join(out)


#: Work difflib may do to find the lines two contents share (about one step of its inner
#: loop each): its matching is quadratic on some inputs (many short matches between
#: changed lines, as a ``replace_all`` makes), which would take hours for a few MiB. Past
#: it the diff is made in linear time, still exact, maybe less minimal.
MAX_DIFF_WORK = 1_000_000


class _Costly(Exception):
    pass


_Op = tuple[str, int, int, int, int]


def _grouped(a: list[str], b: list[str], context: int) -> list[list[_Op]]:
    """The opcodes of the diff from ``a`` to ``b`` in hunks of ``context`` lines around, as
    :meth:`difflib.SequenceMatcher.get_grouped_opcodes` gives them, within the bound."""
    import difflib  # only when something changed

    class Bounded(difflib.SequenceMatcher):
        ops: list[_Op] | None = None
        cost: list[int] | None = None
        spent = 0

        def find_longest_match(self, alo: int = 0, ahi: int | None = None, blo: int = 0,
                               bhi: int | None = None) -> Any:
            if self.cost is None:  # steps of its loop for a[:i]: 1 + where a[i] is in b
                from itertools import accumulate

                b2j = self.b2j  # type: ignore[attr-defined]
                self.cost = [0, *accumulate(1 + len(b2j.get(x, ())) for x in a)]
            ahi = len(a) if ahi is None else ahi
            self.spent += self.cost[ahi] - self.cost[alo]
            if self.spent > MAX_DIFF_WORK:
                raise _Costly
            return super().find_longest_match(alo, ahi, blo, len(b) if bhi is None else bhi)

        def get_opcodes(self) -> Any:
            return self.ops if self.ops is not None else super().get_opcodes()

    try:
        return list(Bounded(None, a, b, autojunk=True).get_grouped_opcodes(context))
    except _Costly:
        matcher = Bounded(None, [], [])
    matcher.ops = _anchored(a, b)
    return list(matcher.get_grouped_opcodes(context))


def _anchored(a: list[str], b: list[str]) -> list[_Op]:
    """Opcodes from ``a`` to ``b`` in O(n log n): the lines found once in each, in the
    longest order both share (patience diff's anchors), grown by the equal lines around
    them; what lies between is replaced (line for line when both sides have as many)."""
    from bisect import bisect_left
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    where = {line: j for j, line in enumerate(b) if cb[line] == 1}
    pairs = [(i, where[line]) for i, line in enumerate(a) if ca[line] == 1 and line in where]
    tails: list[int] = []  # the longest chain of pairs increasing in both
    ends: list[int] = []
    before: list[int | None] = []
    for k, (_, j) in enumerate(pairs):
        x = bisect_left(tails, j)
        tails[x:x + 1], ends[x:x + 1] = [j], [k]
        before.append(ends[x - 1] if x else None)
    chain: list[tuple[int, int]] = []
    at = ends[-1] if ends else None
    while at is not None:
        chain.append(pairs[at])
        at = before[at]
    ops: list[_Op] = []

    def emit(tag: str, i1: int, i2: int, j1: int, j2: int) -> None:
        if i1 == i2 and j1 == j2:
            return
        if ops and ops[-1][0] == tag:
            tag, i1, _, j1, _ = ops.pop()
        ops.append((tag, i1, i2, j1, j2))

    i = j = 0
    for ai, bj in [*reversed(chain), (len(a), len(b))]:
        si, sj = i, j
        while i < ai and j < bj and a[i] == b[j]:
            i, j = i + 1, j + 1
        emit("equal", si, i, sj, j)
        ei, ej = ai, bj
        while ei > i and ej > j and a[ei - 1] == b[ej - 1]:
            ei, ej = ei - 1, ej - 1
        if ei - i == ej - j:
            for k in range(ei - i):
                emit("equal" if a[i + k] == b[j + k] else "replace", i + k, i + k + 1,
                     j + k, j + k + 1)
        else:
            emit("replace" if ei > i and ej > j else "delete" if ei > i else "insert",
                 i, ei, j, ej)
        emit("equal", ei, min(ai + 1, len(a)), ej, min(bj + 1, len(b)))
        i, j = ai + 1, bj + 1
    return ops


def _range(start: int, stop: int) -> str:
    """A hunk's range as ``diff -u`` writes it (``difflib._format_range_unified``)."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


_QUOTED = re.compile(r'[\x00-\x1f\x7f"\\]')


def _quote(name: str) -> str:
    """``name`` as git writes it in a diff header: in double quotes with C escapes when it
    holds a control character, a double quote or a backslash."""
    if _QUOTED.search(name) is None:
        return name
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
    return '"' + _QUOTED.sub(lambda m: named.get(m[0], f"\\{ord(m[0]):03o}"), name) + '"'


def _counts(diff: str) -> tuple[int, int]:
    """Lines added and removed: the ``+`` and ``-`` rows after the first hunk header (a
    removed line ``-- x`` is the row ``--- x``, not a header)."""
    added = removed = 0
    hunks = False
    for line in _lines(diff):
        if line.startswith("@@ "):
            hunks = True
        elif hunks and line.startswith("+"):
            added += 1
        elif hunks and line.startswith("-"):
            removed += 1
    return added, removed


def record(path: str, before: bytes | None, after: bytes | None, *,
           moved_to: str | None = None, unread: int | None = None) -> Change:
    """Record that the current tool call changed ``path`` from ``before`` to ``after``
    (``None``: the file did not exist / no longer exists); return the change.

    ``moved_to`` names the new path of a move; ``unread`` is the size of an old content too
    large to have been read (the change is then recorded without its diff, incomplete).
    Inside a tool call the change is written with the call's ``tool/result``; outside one (a
    script calling a tool's function) it is only returned.
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


def checked(changes: Iterable[object]) -> tuple[Change, ...]:
    """The changes a tool result may record: :class:`Change` values whose every field has
    the type the ledger reads back (a plugin may append anything to ``call.changes``; a
    value that would make the session unreadable is dropped, never written)."""
    from dsh.ledger.parts import dump_changes
    from dsh.ledger.parts import raw_changes

    kept = []
    for c in changes:
        try:
            if type(c) is not Change:
                continue
            plain = dump_changes((c,))
            json.dumps(plain, ensure_ascii=False).encode("utf-8")  # no lone surrogate
            if raw_changes(plain) == (c,):
                kept.append(c)
        except Exception:  # noqa: BLE001,S112 - any shape the loader refuses is dropped
            continue
    return tuple(kept)


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
