"""``apply_patch``: several files added, deleted, updated and renamed by one patch, all or
nothing.

The patch is in Codex's ``apply_patch`` format (openai/codex, ``codex-rs/apply-patch``)::

    *** Begin Patch
    *** Add File: PATH          then the file's lines, each after a '+'
    *** Delete File: PATH
    *** Update File: PATH
    *** Move to: NEWPATH        (optional)
    @@ CONTEXT                  (CONTEXT optional: a line above the change that places it)
     context / -removed / +added lines
    *** End of File             (optional: the hunk ends at the end of the file)
    *** End Patch

parsed as leniently as Codex parses it (markers may carry surrounding whitespace, the patch
may come wrapped in a ``<<'EOF'`` heredoc, the first hunk of a file may omit its ``@@``, a
blank line in a hunk is an empty context line). Two things are more lenient still: blank
lines between file sections are skipped, and a unified diff's range header
(``@@ -3,4 +3,5 @@``) is read as ``@@`` with no context.

A hunk's lines are looked for as Codex's ``seek_sequence`` does: exactly, then ignoring
trailing whitespace, then ignoring leading and trailing whitespace (not its last pass, which
folds Unicode dashes and quotes into ASCII), from where the previous hunk of the file ended;
line endings never take part. Context lines are kept as the *file*
has them (a loosely matched line is not rewritten), added lines get the file's usual ending,
and a file that ended without a newline still does. A hunk of added lines only goes right
after its ``@@`` line when that names one (Codex would put it at the end), else at the end.

**Atomic across files.** Every new content is computed in memory and every target checked
(an added file or a move target must not exist, an updated, deleted or moved file must, no
path appears twice, no persistence path) before anything is written; the approval is asked
once, for the whole patch; every file is checked again to still be as it was (the approval
may have waited for a person); then the files are written one by one, each step keeping how
to undo it, and a failed step undoes the ones before it, in reverse order: a patch applies
whole or not at all. Each file records its own :class:`~dsh.core.messages.Change`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable

import attrs

from dsh.core.errors import ToolError
from dsh_shell import edit
from dsh_shell import workspace

BEGIN = "*** Begin Patch"
END = "*** End Patch"
ADD = "*** Add File: "
DELETE = "*** Delete File: "
UPDATE = "*** Update File: "
MOVE = "*** Move to: "
EOF_MARK = "*** End of File"
HEREDOC = ("<<EOF", "<<'EOF'", '<<"EOF"')
_RANGE = re.compile(r"^-\d+(,\d+)? \+\d+(,\d+)? @@")
#: Names listed in the approval question of a patch of several files.
LISTED = 10


@attrs.frozen
class Chunk:
    """One ``@@`` hunk of an updated file."""

    #: The patch line it starts on (1-based).
    line: int
    #: The text after ``@@``: a line of the file above the change, or ``None``.
    context: str | None
    #: ``(" " | "-" | "+", text)`` in order.
    ops: tuple[tuple[str, str], ...]
    #: The hunk ends at the end of the file (``*** End of File``).
    eof: bool


@attrs.frozen
class Section:
    """One file section of the patch."""

    #: ``add``, ``delete`` or ``update``.
    kind: str
    #: The path as the patch names it.
    path: str
    #: The patch line of its header (1-based).
    line: int
    move_to: str | None = None
    #: An added file's content.
    contents: str = ""
    chunks: tuple[Chunk, ...] = ()


def _bad(line: int, why: str, path: str | None = None) -> ToolError:
    where = f" (in the section for {path})" if path else ""
    return ToolError(f"invalid patch at line {line}{where}: {why}")


# -- parsing ---------------------------------------------------------------------------------------


def parse(patch: str) -> list[Section]:
    """The file sections of ``patch``; a ToolError naming the patch line when it is not one."""
    lines = [ln.removesuffix("\r") for ln in patch.split("\n")]
    first, end = _bounds(lines)
    sections: list[Section] = []
    i = first + 1
    while i < end:
        header = lines[i].strip()
        if not header:
            i += 1
        elif header.startswith(ADD):
            header_line, contents, i = i + 1, [], i + 1
            while i < end and lines[i].startswith("+"):
                contents.append(lines[i][1:] + "\n")
                i += 1
            sections.append(Section("add", header[len(ADD):].strip(), header_line,
                                    contents="".join(contents)))
        elif header.startswith(DELETE):
            sections.append(Section("delete", header[len(DELETE):].strip(), i + 1))
            i += 1
        elif header.startswith(UPDATE):
            section, i = _update(lines, i, end)
            sections.append(section)
        else:
            raise _bad(i + 1, f"{lines[i]!r} is not a file header: a section starts with "
                              f"'{ADD}PATH', '{DELETE}PATH' or '{UPDATE}PATH'")
    return sections


def _bounds(lines: list[str]) -> tuple[int, int]:
    """The indexes of the ``*** Begin Patch`` and ``*** End Patch`` lines."""
    filled = [k for k, text in enumerate(lines) if text.strip()]
    if not filled:
        raise _bad(1, f"the patch is empty: it starts with {BEGIN!r} and ends with {END!r}")
    first, last = filled[0], filled[-1]
    if (lines[first].strip() in HEREDOC and lines[last].strip().endswith("EOF")
            and len(filled) >= 4):
        first, last = filled[1], filled[-2]  # a shell heredoc around the patch
    if lines[first].strip() != BEGIN:
        raise _bad(first + 1, f"the first line of the patch must be {BEGIN!r}")
    if last == first or lines[last].strip() != END:
        raise _bad(last + 1, f"the last line of the patch must be {END!r}")
    return first, last


def _update(lines: list[str], i: int, end: int) -> tuple[Section, int]:
    header_line = i + 1
    path = lines[i].strip()[len(UPDATE):].strip()
    i += 1
    move_to = None
    if i < end and lines[i].strip().startswith(MOVE):
        move_to = lines[i].strip()[len(MOVE):].strip()
        i += 1
    chunks: list[Chunk] = []
    while i < end:
        if not lines[i].strip():
            i += 1  # blank lines between hunks
        elif lines[i].startswith("*"):
            break  # the next section
        else:
            chunk, i = _chunk(lines, i, end, path, first=not chunks)
            chunks.append(chunk)
    if not chunks:
        raise _bad(header_line, "an Update File section needs at least one hunk of changes",
                   path)
    return Section("update", path, header_line, move_to=move_to, chunks=tuple(chunks)), i


def _chunk(lines: list[str], i: int, end: int, path: str, *, first: bool
           ) -> tuple[Chunk, int]:
    start = i + 1
    head = lines[i]
    context: str | None = None
    if head.rstrip() == "@@":
        i += 1
    elif head.startswith("@@ "):
        context = None if _RANGE.match(head[3:]) else head[3:]
        i += 1
    elif not first:
        raise _bad(start, f"expected a hunk starting with '@@', got {head!r}", path)
    ops: list[tuple[str, str]] = []
    eof = False
    while i < end:
        text = lines[i]
        if text.rstrip() == EOF_MARK:
            eof = True
            i += 1
            break
        if not text:
            ops.append((" ", ""))  # a blank line is an empty context line
        elif text[0] in " -+":
            ops.append((text[0], text[1:]))
        elif ops:
            break  # the next hunk, or the next section
        else:
            raise _bad(i + 1, f"unexpected line {text!r} in a hunk: each line of a hunk "
                              "starts with ' ' (context), '-' (removed) or '+' (added)", path)
        i += 1
    if not ops:
        raise _bad(start, "a hunk has no lines", path)
    return Chunk(start, context, tuple(ops), eof), i


# -- applying to a file's text ---------------------------------------------------------------------


def seek(lines: list[str], pattern: list[str], start: int, eof: bool) -> int | None:
    """Where ``pattern`` first occurs in ``lines`` from index ``start``: compared exactly, then
    without trailing whitespace, then without leading and trailing whitespace (Codex's
    ``seek_sequence``). With ``eof`` the end of the file is tried first."""
    return edit.Lines(lines).find(edit.forms_of(pattern), len(pattern), start, eof)


def _split(body: str) -> list[tuple[str, str]]:
    """``body``'s lines as ``(text, ending)``; only the last may have the ending ``""``."""
    parts = body.split("\n")
    tail = parts.pop()  # what follows the last newline: "" or a last line without one
    lines = [(p[:-1], "\r\n") if p.endswith("\r") else (p, "\n") for p in parts]
    if tail:
        lines.append((tail, ""))
    return lines


def apply_chunks(body: str, chunks: tuple[Chunk, ...]) -> str:
    """``body`` with the ``chunks`` of one ``Update File`` section applied."""
    lines = _split(body)
    texts = [t for t, _ in lines]
    crlf = sum(1 for _, e in lines if e == "\r\n")
    eol = "\r\n" if crlf > len(lines) - crlf else "\n"
    spans: list[tuple[int, int, tuple[tuple[str, str], ...]]] = []
    at = 0
    view = edit.Lines(texts)
    for chunk in chunks:
        if chunk.context is not None:
            found = view.find(edit.forms_of([chunk.context]), 1, at, eof=False)
            if found is None:
                after = f" after line {at}" if at else ""
                raise ToolError(f"the line {chunk.context!r} named by the '@@' at patch line "
                                f"{chunk.line} is not in the file{after}")
            at = found + 1
        ops = chunk.ops
        old = [t for op, t in ops if op != "+"]
        if not old:  # only added lines: after the @@ line, else at the end
            spans.append((len(texts) if chunk.eof or chunk.context is None else at, 0, ops))
            continue
        wants, n, cut = edit.forms_of(old), len(old), 0
        found = view.find(wants, n, at, chunk.eof)
        while found is None and cut < len(ops) and ops[-1 - cut] == (" ", ""):
            # Blank lines at a hunk's end are often the gap before the next header, not
            # lines of the file: try without them (Codex does, for one).
            cut, n = cut + 1, n - 1
            found = view.find(wants, n, at, chunk.eof)
        if found is None:
            raise ToolError(_mismatch(texts, chunk, at))
        spans.append((found, n, ops[:len(ops) - cut]))
        at = found + n
    out: list[tuple[str, str]] = []
    done = 0  # lines of the file copied to out so far
    # In the file's order (of two spans at one index, lines added after an @@ line and a
    # hunk right there, the first one first), each in one pass.
    for start, count, ops in sorted(spans, key=lambda s: s[0]):
        out.extend(lines[done:start])
        k = start
        for op, text in ops:
            if op == " ":
                out.append(lines[k])  # the file's own line, not the patch's loose copy
            elif op == "+":
                out.append((text, eol))
            k += op != "+"
        done = start + count
    out.extend(lines[done:])
    open_end = bool(lines) and lines[-1][1] == ""
    for k in range(len(out) - 1):
        if not out[k][1]:
            out[k] = (out[k][0], eol)
    if out:
        out[-1] = (out[-1][0], "" if open_end else out[-1][1] or eol)
    return "".join(t + e for t, e in out)


def _mismatch(texts: list[str], chunk: Chunk, at: int) -> str:
    after = f" after line {at}" if at else ""
    why = (f"the lines of the hunk at patch line {chunk.line} are not in the file{after} "
           "(compared exactly, then ignoring the whitespace around each line)")
    probe = next((t for op, t in chunk.ops if op != "+" and t.strip()), None)
    if probe is None:
        return why
    hits = [str(k + 1) for k, t in enumerate(texts) if t.strip() == probe.strip()]
    if not hits:
        return f"{why}; its first line {probe!r} is nowhere in the file: read it again"
    return (f"{why}; its first line {probe!r} is at line {', '.join(hits[:edit.LISTED])} but "
            "the lines after it differ: read the file again and copy them exactly")


# -- the patch as a whole --------------------------------------------------------------------------


@attrs.define
class Step:
    """One file of the patch, ready to write: its bytes before and after."""

    #: ``A`` added, ``M`` updated, ``D`` deleted, ``R`` moved (maybe updated too).
    kind: str
    line: int
    rel: str
    before: bytes | None
    after: bytes | None
    move_to: str | None = None
    preview: str = ""
    note: str = ""


def apply(root: str, patch: str, unprotected: tuple[str, ...],
          protect: tuple[str, ...]) -> str:
    """Apply ``patch`` to the workspace ``root``, whole or not at all; the model's result."""
    from dsh.tools import changes

    sections = parse(patch)
    if not sections:
        raise ToolError("the patch changes no file: give at least one Add File, Delete File "
                        "or Update File section")
    steps = [_plan(root, s, unprotected, protect) for s in sections]
    touched = _touched(steps)
    summary = [_summary(s) for s in steps]
    if len(touched) == 1:
        subject, reason = touched[0], ""
    else:  # the grant "always for this folder" then covers every file of the patch
        common = os.path.commonpath(touched)
        subject = f"{common}/*" if common else "*"
        more = ", …" if len(touched) > LISTED else ""
        reason = f"{len(touched)} files: {', '.join(touched[:LISTED])}{more}"
    edit.approve("apply_patch", root, subject,
                 "\n".join(summary) + "\n" + "".join(s.preview for s in steps), reason)
    for s in steps:
        edit.unchanged(root, s.rel, s.before, s.rel)
        if s.move_to is not None:
            edit.unchanged(root, s.move_to, None, s.move_to)
    _write_all(root, [s for s in steps if s.before != s.after or s.move_to])
    recorded = []
    for s in steps:
        if s.before != s.after or s.move_to:
            recorded.append(changes.record(s.rel, s.before, s.after, moved_to=s.move_to))
        if s.after is not None:
            edit.remember_read(root, s.move_to or s.rel, s.after)
    notes = "".join(s.note for s in steps)
    return "\n".join(summary) + "\n" + changes.for_model(recorded) + notes


def _plan(root: str, section: Section, unprotected: tuple[str, ...],
          protect: tuple[str, ...]) -> Step:
    """The :class:`Step` of one section, every check made and its new bytes computed."""
    from dsh.tools import changes

    try:
        rel = edit.target(root, section.path, unprotected, protect, "apply_patch")
        if section.kind == "add":
            _absent(root, rel, section.path)
            after = edit.encode(edit.Text("", b"", "utf-8"), section.contents, section.path)
            return Step("A", section.line, rel, None, after,
                        preview=changes.diff_of("", section.contents, rel, created=True))
        if (section.kind == "delete" or section.move_to is not None) and _link(root,
                                                                               section.path):
            raise ToolError(f"{section.path!r} is a symbolic link: apply_patch deletes and "
                            "moves files, not links (it would act on the file the link names)")
        before = edit.read(root, rel, section.path)
        note = edit.stale(root, rel, before, section.path)
        if section.kind == "delete":
            try:
                shown = changes.diff_of(before.decode("utf-8"), "", rel, deleted=True)
            except UnicodeDecodeError:
                shown = f"delete {rel} ({len(before)} bytes, not UTF-8 text)\n"
            return Step("D", section.line, rel, before, None, preview=shown, note=note)
        text = edit.decode(before, section.path)
        try:
            body = apply_chunks(text.body, section.chunks)
        except ToolError as exc:
            raise ToolError(f"{exc}{note}") from None
        move_to = None
        if section.move_to is not None:
            move_to = edit.target(root, section.move_to, unprotected, protect, "apply_patch")
            if move_to == rel:
                move_to = None  # moved onto itself: an update
            else:
                _absent(root, move_to, section.move_to)
        return Step("R" if move_to else "M", section.line, rel, before,
                    edit.encode(text, body, section.path), move_to=move_to, note=note,
                    preview=changes.diff_of(text.body, body, rel, new_path=move_to))
    except ToolError as exc:
        raise ToolError(f"apply_patch wrote nothing: {section.kind} {section.path} (patch line "
                        f"{section.line}): {exc}") from None


def _absent(root: str, rel: str, path: str) -> None:
    """Refuse unless nothing exists at ``rel`` (a file to add, or a move's target), nor at
    ``path`` as written (a symbolic link, maybe dangling, there is something)."""
    from dsh.core import beneath

    if _link(root, path):
        raise ToolError(f"{path!r} already exists, as a symbolic link")
    try:
        os.close(beneath.open_beneath(root, rel, os.O_PATH))
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise ToolError(f"a folder on the way to {path!r} is a file") from None
    except OSError as exc:
        raise workspace._os_error(path, exc) from None
    raise ToolError(f"{path!r} already exists: change it with an Update File section, or "
                    "delete it first")


def _link(root: str, path: str) -> bool:
    """Whether ``path`` as written (its last part not followed) is a symbolic link."""
    return os.path.islink(os.path.join(root, path.rstrip("/")))


def _touched(steps: list[Step]) -> list[str]:
    """Every path the steps write, refusing one named twice (two sections of one file would
    each be computed from the old content, and the second would undo the first)."""
    lines: dict[str, int] = {}
    for s in steps:
        for rel in (s.rel, s.move_to):
            if rel is None:
                continue
            if rel in lines:
                raise ToolError(f"apply_patch wrote nothing: {rel} appears twice in the patch "
                                f"(lines {lines[rel]} and {s.line}): give each file one "
                                "section")
            lines[rel] = s.line
    return list(lines)


def _summary(s: Step) -> str:
    if s.kind == "R":
        return f"R {s.rel} -> {s.move_to}"
    return f"{s.kind} {s.rel}" + (" (already as the patch has it)" if s.before == s.after
                                  else "")


def _write_all(root: str, steps: list[Step]) -> None:
    """Write every step in order; when one fails, undo those done, newest first (a folder
    made for an added file stays, empty)."""
    from dsh.core import files

    undo: list[tuple[str, Callable[[], object]]] = []
    for s in steps:
        try:
            _write(root, s, undo)
        except BaseException as exc:  # an interrupt too: never leave half a patch on disk
            failed = []
            for rel, action in reversed(undo):
                try:
                    action()
                except OSError as again:
                    failed.append(f"{rel} ({again.strerror or again})")
            if not isinstance(exc, OSError):
                raise
            if isinstance(exc, FileExistsError):
                why = f"{s.move_to} appeared while the patch was applied"
            elif type(exc) is OSError:  # no more specific kind: the disk, the file system
                why = f"writing it failed: {files.reason(exc)}"
            else:
                why = str(workspace._os_error(s.rel, exc))
            kept = ("the files written before it were restored, so nothing changed"
                    if not failed else f"restoring failed for {', '.join(failed)}: check them")
            raise ToolError(f"apply_patch failed at {s.rel} (patch line {s.line}): {why}; "
                            f"{kept}") from None


def _write(root: str, s: Step, undo: list[tuple[str, Callable[[], object]]]) -> None:
    """Make one step's change, and add how to undo it to ``undo``."""
    from dsh.core import beneath

    if s.kind == "A":
        assert s.after is not None
        beneath.write(root, s.rel, s.after, create_dirs=True)
        undo.append((s.rel, lambda: beneath.remove(root, s.rel)))
        return
    assert s.before is not None
    before = s.before
    if s.kind == "D":
        old = beneath.remove(root, s.rel)
        undo.append((s.rel, lambda: beneath.write(root, s.rel, before,
                                                  mode=stat.S_IMODE(old.st_mode))))
        return
    assert s.after is not None
    where = s.rel
    if s.move_to is not None:
        dst = where = s.move_to
        beneath.rename(root, s.rel, dst, create_dirs=True)
        undo.append((s.rel, lambda: beneath.rename(root, dst, s.rel)))
    if s.after != before:
        beneath.write(root, where, s.after)
        undo.append((where, lambda: beneath.write(root, where, before)))
