"""The edit tools of the workbench: ``edit_file`` and ``multi_edit`` (``apply_patch`` is in
:mod:`dsh_shell.patch`, registered here with them).

An edit replaces *exact* text, so the model must quote what the file holds; when it does not,
the error says why (how many matches and on which lines, or that a match exists once
whitespace or line endings are ignored) so the next attempt can be right. What the model
cannot see is kept as the file has it:

* **line endings**: in a CRLF file the model's ``\\n`` text is matched with the endings set
  aside and written back with CRLF; a file mixing both is matched exactly, and the error
  says so when only an ending differs;
* **a UTF-8 BOM** stays in front and is never part of the matched text;
* **the encoding**: UTF-8, or latin-1 for a file that is not valid UTF-8 (every byte is a
  latin-1 character, so such a file round-trips exactly); a NUL byte in the first 8 KiB
  means binary, refused; a file over :data:`MAX_EDIT` is refused before it is read.

Paths are confined and the persistence paths refused as ``write_file`` does
(:func:`dsh_shell.workspace.write_text`); every read and write goes through
:mod:`dsh.core.beneath`, by descriptor. A write asks the approval service first, showing its
diff, and records its :class:`~dsh.core.messages.Change`. Approval may wait minutes for a
person, so the file is read again before it is replaced: a file another program changed
meanwhile is left alone, instead of losing that change.

**Stale reads**: per session, the digest of what ``read_file`` (:func:`remember_read`) and
these tools last saw of each file is kept; an edit of a file that changed on disk since says
so, in its result or its error, since the model's idea of the file is then out of date.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import threading
from collections.abc import Callable
from typing import Any

import attrs

from dsh.core.errors import ToolError
from dsh.host.stash import StashKey
from dsh_shell import workspace

#: Bytes of the largest file the edit tools change: it is held in memory a few times over
#: (old, new, diff), so a huge file is refused before it is read.
MAX_EDIT = 8 << 20
#: Bytes looked at for a NUL, which marks a binary file (as ``read_file`` does).
PROBE = 8192
UTF8_BOM = b"\xef\xbb\xbf"
#: Match positions looked for at most (enough to say "at least N" of a too-common ``old``).
MAX_MATCHES = 1000
#: Line numbers listed in an error about several matches.
LISTED = 10


@attrs.frozen
class Text:
    """A file's content as the edit tools change it, and how to write it back."""

    #: The decoded text, without the BOM.
    body: str
    #: The UTF-8 byte order mark the file starts with, or ``b""``.
    bom: bytes
    #: ``utf-8``, or ``latin-1`` for a file that is not valid UTF-8.
    encoding: str


# -- files: the target, its content, its bytes -----------------------------------------------------


def target(root: str, path: str, unprotected: tuple[str, ...], protect: tuple[str, ...],
           tool: str) -> str:
    """``path`` confined to the workspace (:func:`dsh_shell.workspace.resolve`), ``/``-joined,
    after refusing the workspace itself and the persistence paths as ``write_file`` does."""
    parts = [p for p in workspace.resolve(root, path).split(os.sep) if p not in ("", ".")]
    if not parts:
        raise ToolError("the path is the workspace directory itself, not a file")
    rel = "/".join(parts)
    shaped = shapes(root, path, rel, unprotected, protect)
    if shaped is not None:
        raise ToolError(f"{path!r} is {shaped}, a file that shapes later runs (git, dsh and "
                        f"Claude Code obey it): {tool} does not change it. The person may "
                        f"allow it with [sandbox] unprotected = [{shaped!r}]")
    return rel


def shapes(root: str, path: str, rel: str, unprotected: tuple[str, ...],
           protect: tuple[str, ...]) -> str | None:
    """The persistence path that ``rel`` (``path`` resolved) is, or lies in, judged three
    ways, as a write through any of them would reach it: by ``rel``; by ``path`` as written
    (``.git/config`` when ``.git`` is a symlink to a folder elsewhere in the workspace), and
    by where such a symlinked entry really is; each also with case, compatibility forms,
    invisible format characters and trailing dots and spaces folded away (a case-insensitive
    file system, such as a Windows drive under WSL, finds ``.MCP.json`` as ``.mcp.json``)."""
    from dsh.core.beneath import PERSISTENCE

    lexical = os.path.normpath(path).replace(os.sep, "/")
    for entry in (*PERSISTENCE, *protect):
        if entry in unprotected:
            continue
        places = [_fold(entry)]
        link = os.path.join(root, entry)
        if os.path.islink(link):  # where the entry really is, if inside the workspace
            real = os.path.realpath(link)
            if real == root:  # the workspace itself: all of it is that entry
                return entry
            if workspace._inside(root, real):
                places.append(_fold(os.path.relpath(real, root).replace(os.sep, "/")))
        for name in (_fold(rel), _fold(lexical)):
            if any(name == p or name.startswith(p + "/") for p in places):
                return entry
    return None


def _fold(rel: str) -> str:
    """``rel`` as a case-insensitive file system may compare it."""
    import unicodedata

    parts = []
    for part in rel.split("/"):
        part = "".join(c for c in part if unicodedata.category(c) != "Cf")
        parts.append(unicodedata.normalize("NFKC", part).casefold().rstrip(" ."))
    return "/".join(parts)


def read(root: str, rel: str, path: str) -> bytes:
    """The bytes of ``rel``, at most :data:`MAX_EDIT` (checked on the file's size before
    anything is read), or a ToolError naming ``path``."""
    from dsh.core import beneath
    from dsh.core import files

    try:
        return beneath.read(root, rel, MAX_EDIT)
    except files.TooLarge as exc:
        size = f"{exc.size} bytes" if exc.exact else f"more than {MAX_EDIT} bytes"
        raise ToolError(f"{path!r} is too large to edit ({size}; the edit tools change files "
                        f"of up to {MAX_EDIT >> 20} MiB): change it with run_command (sed, a "
                        "script) or replace it with write_file") from None
    except FileNotFoundError:
        raise ToolError(f"no such file in the workspace: {path!r} (to create a file, use "
                        "write_file or an Add File section of apply_patch)") from None
    except files.NotRegular as exc:
        if exc.kind == "a directory":
            raise ToolError(f"{path!r} is a directory, not a file") from None
        raise ToolError(f"{path!r} is {exc.kind}, not a regular file") from None
    except OSError as exc:
        raise workspace._os_error(path, exc) from None


def decode(data: bytes, path: str) -> Text:
    """``data`` as text (UTF-8 after an optional BOM, else latin-1); binary is refused."""
    if b"\0" in data[:PROBE]:
        raise ToolError(f"{path!r} looks like a binary file (a NUL byte in its first "
                        f"{PROBE // 1024} KiB): the edit tools change text files only")
    bom = UTF8_BOM if data.startswith(UTF8_BOM) else b""
    try:
        return Text(data[len(bom):].decode("utf-8"), bom, "utf-8")
    except UnicodeDecodeError:
        return Text(data.decode("latin-1"), b"", "latin-1")


def encode(text: Text, body: str, path: str) -> bytes:
    """``body`` in ``text``'s encoding, after its BOM; a character it cannot hold is an error."""
    try:
        return text.bom + body.encode(text.encoding)
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start]
        if text.encoding == "latin-1":
            raise ToolError(f"{path} is not UTF-8, so it is kept in latin-1, which has no "
                            f"{bad!r} (U+{ord(bad):04X}) for the new text: use latin-1 "
                            "characters only, or rewrite the whole file as UTF-8 with "
                            "write_file") from None
        raise ToolError(f"the new text holds U+{ord(bad):04X}, an unpaired surrogate that "
                        "UTF-8 cannot encode") from None


def unchanged(root: str, rel: str, before: bytes | None, path: str) -> None:
    """Refuse unless ``rel`` still holds ``before`` (``None``: still absent). Called after the
    approval, which may have waited for a person while another program wrote the file:
    replacing it then would silently undo that program's change."""
    from dsh.core import beneath

    changed = ToolError(f"{path!r} changed while the write waited for approval: nothing was "
                        "written; read it again and redo the change")
    try:
        now: bytes | None = beneath.read(root, rel, MAX_EDIT)
    except FileNotFoundError:
        now = None
    except OSError:  # it became too large, a folder, a link: changed all the same
        raise changed from None
    if now != before:
        raise changed


def approve(tool: str, root: str, subject: str, preview: str, reason: str = "") -> None:
    """Ask the approval service for a write of ``subject``, showing the diff ``preview``."""
    from dsh.tools import approval

    approval.request(approval.Ask(tool=tool, action="write", subject=subject, root=root,
                                  detail=workspace._bounded(preview), reason=reason))


# -- replacing text --------------------------------------------------------------------------------


def _lf(text: str) -> str:
    return text.replace("\r\n", "\n")


def replace(body: str, old: str, new: str, *, replace_all: bool, path: str) -> tuple[str, int]:
    """``body`` with ``old`` replaced by ``new`` (once, or every time with ``replace_all``) in
    the file's own line endings, and the number of replacements; a ToolError saying why not."""
    if not old:
        raise ToolError(f"old is empty: give the exact text to replace in {path} (to create "
                        "or overwrite a whole file, use write_file)")
    if old == new:
        raise ToolError(f"old and new are the same text: the edit would change nothing in "
                        f"{path}")
    crlf = body.count("\r\n")
    lf = body.count("\n") - crlf
    if crlf and not lf:
        # A CRLF file: matched and replaced with every ending set aside, then every line of
        # the result given the file's ending again (exact for the lines not replaced).
        o, n = _lf(old), _lf(new)
        if o == n:
            raise ToolError(f"old and new differ only in line endings, which the edit keeps "
                            f"as {path} has them (CRLF)")
        view, count = _replace_in(_lf(body), o, n, replace_all, path, mixed=False)
        return view.replace("\n", "\r\n"), count
    if not crlf:
        old, new = _lf(old), _lf(new)  # CRLF text for an LF file: the file's endings win
        if old == new:
            raise ToolError(f"old and new differ only in line endings, which the edit keeps "
                            f"as {path} has them (LF)")
    return _replace_in(body, old, new, replace_all, path, mixed=bool(crlf and lf))


def _replace_in(text: str, old: str, new: str, replace_all: bool, path: str, *,
                mixed: bool) -> tuple[str, int]:
    starts = _starts(text, old)
    if not starts:
        raise ToolError(_not_found(text, old, path, mixed))
    count = text.count(old) if replace_all else 1
    if len(text) + count * (len(new) - len(old)) > MAX_EDIT:  # before it is made
        raise ToolError(f"the edit would make {path} longer than the edit tools make a file "
                        f"({MAX_EDIT >> 20} MiB): write it with write_file, or in parts")
    if replace_all:
        return text.replace(old, new), count
    if len(starts) > 1:
        lines = _lines_of(text, starts)
        shown = ", ".join(map(str, lines[:LISTED])) + (", …" if len(lines) > LISTED else "")
        many = f"at least {len(starts)}" if len(starts) == MAX_MATCHES else str(len(starts))
        raise ToolError(f"old matches {many} places in {path} (at lines {shown}): include "
                        "more of the surrounding text to make it unique, or pass "
                        "replace_all=true to replace every one")
    at = starts[0]
    return text[:at] + new + text[at + len(old):], 1


def _starts(text: str, old: str) -> list[int]:
    """Where ``old`` starts in ``text``, overlapping matches included (two overlapping
    matches are as ambiguous as two apart), at most :data:`MAX_MATCHES`."""
    found: list[int] = []
    at = text.find(old)
    while at >= 0 and len(found) < MAX_MATCHES:
        found.append(at)
        at = text.find(old, at + 1)
    return found


def _lines_of(text: str, starts: list[int]) -> list[int]:
    """The 1-based line of each of the ascending offsets ``starts``."""
    lines: list[int] = []
    line, prev = 1, 0
    for at in starts:
        line += text.count("\n", prev, at)
        prev = at
        lines.append(line)
    return lines


def _not_found(text: str, old: str, path: str, mixed: bool) -> str:
    why = f"old was not found in {path}"
    if mixed:
        at = _lf(text).find(_lf(old))
        if at >= 0:
            line = _lines_of(_lf(text), [at])[0]
            return (f"{why}: {path} mixes CRLF and LF line endings, and old matches at line "
                    f"{line} only with its endings ignored; send old with the file's exact "
                    "endings there, or use apply_patch, which matches lines whatever their "
                    "endings")
    words = old.split()
    if words:
        # The same words with other whitespace between them: another indentation, spaces
        # or line breaks. Searched in the text with each run of whitespace made one space,
        # in linear time (a regex of the words is O(text × words) on repetitive text).
        flat = re.sub(r"\s+", " ", text)
        at = flat.find(" ".join(words))
        if at >= 0:
            word = flat.count(" ", 0, at) - flat.startswith(" ")  # which word it starts in
            into = at - (flat.rfind(" ", 0, at) + 1)
            start = next(itertools.islice(re.finditer(r"\S+", text), word, None)).start()
            line = _lines_of(text, [start + into])[0]
            why += (f"; text that differs from it only in whitespace (indentation, spaces, "
                    f"line breaks) starts at line {line}: copy old exactly as the file has it")
    return why


def _hints(text: Text, old: str) -> str:
    """What else may explain a failed match: a latin-1 file read as UTF-8 by read_file."""
    if text.encoding == "latin-1" and "\ufffd" in old:
        return ("; the file is not UTF-8 (it is edited as latin-1), so read_file showed its "
                "non-UTF-8 bytes as U+FFFD, which old must not contain: choose old around them")
    return ""


# -- finding lines (apply_patch) -----------------------------------------------------------------


#: Lines of a file the hunks of apply_patch may look at to be placed (passed by, or
#: compared): far more than any real patch needs, and a bound on a hostile one's time.
MAX_SEEK = 100_000_000
_NORMS: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip)


class Lines:
    """A file's lines in each form :func:`dsh_shell.patch.seek` compares (each made once),
    and the work its hunks did so far."""

    def __init__(self, texts: list[str]) -> None:
        self.texts, self.work = texts, 0
        self.forms: list[list[str] | None] = [texts, None, None]
        #: (form, line) → (from, at): the line's first index from ``from`` on is ``at``.
        self.next: dict[tuple[int, str], tuple[int, int]] = {}

    def find(self, wants: list[list[str]], n: int, start: int, eof: bool) -> int | None:
        """Where the first ``n`` lines of a pattern (``wants``: in each form) are."""
        last = len(self.texts) - n
        if last < start or n <= 0:
            return None
        for k, norm in enumerate(_NORMS):
            form = self.forms[k] = self.forms[k] or [norm(t) for t in self.texts]
            head, at = wants[k][0], start
            if eof and self._at(form, wants[k], n, last):
                return last
            while at <= last:
                known = self.next.get((k, head))
                if known is not None and known[0] <= at <= known[1]:
                    found = known[1]  # hunks are placed forwards: asked again, not sought
                else:
                    try:
                        found = form.index(head, at)
                    except ValueError:
                        found = len(form)
                    self.next[k, head] = (at, found)
                    self._spend(found - at)
                if found <= last and self._at(form, wants[k], n, found):
                    return found
                at = found + 1
        return None

    def _at(self, form: list[str], want: list[str], n: int, at: int) -> bool:
        self._spend(2 * n)
        return form[at:at + n] == want[:n]

    def _spend(self, work: int) -> None:
        self.work += work + 1
        if self.work > MAX_SEEK:
            raise ToolError(f"placing the hunks took more than {MAX_SEEK} line comparisons "
                            f"in a file of {len(self.texts)} lines: give each hunk distinctive "
                            "lines of context, or split the patch")


def forms_of(pattern: list[str]) -> list[list[str]]:
    """``pattern`` in each form :class:`Lines` compares."""
    return [[norm(p) for p in pattern] for norm in _NORMS]


# -- what the model last saw -----------------------------------------------------------------------


class _Seen:
    """The SHA-256 of what the model last saw of each file, ``(root, rel)`` → digest."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._digests: dict[tuple[str, str], str] = {}

    def put(self, key: tuple[str, str], digest: str) -> None:
        with self._lock:
            self._digests[key] = digest

    def get(self, key: tuple[str, str]) -> str | None:
        with self._lock:
            return self._digests.get(key)


_SEEN: StashKey[_Seen] = StashKey()
#: Outside any run (a script or a test calling the tools' functions) the caller is one session.
_CALLER = _Seen()


def _seen() -> _Seen:
    """This session's record (the run's, for a run without a session)."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None:
        return _CALLER
    stash = ctx.session.stash if ctx.session is not None else ctx.stash
    return stash.setdefault(_SEEN, _Seen())


def _key(root: str, rel: str) -> tuple[str, str]:
    return root, "/".join(p for p in rel.replace(os.sep, "/").split("/") if p not in ("", "."))


def remember_read(root: str, rel: str, data: bytes) -> None:
    """Note that the model has seen ``data``, the whole content of the file ``rel`` (as
    :func:`dsh_shell.workspace.resolve` returns it) in the workspace ``root``: ``read_file``
    calls it when it returned a whole file, and the edit tools after each write."""
    _seen().put(_key(root, rel), hashlib.sha256(data).hexdigest())


def stale(root: str, rel: str, data: bytes, path: str) -> str:
    """A note when ``data`` (the file now) is not what the model last saw of it, else ``""``."""
    seen = _seen().get(_key(root, rel))
    if seen is None or seen == hashlib.sha256(data).hexdigest():
        return ""
    return (f"\nnote: {path} changed on disk since you last read it (another program or "
            "person wrote it): what you know of it may be out of date; read it again if unsure")


# -- the tools -------------------------------------------------------------------------------------


def edit_text(root: str, path: str, old: str, new: str, replace_all: bool,
              unprotected: tuple[str, ...], protect: tuple[str, ...]) -> str:
    """``edit_file``: one replacement (or every one) of ``old`` by ``new`` in ``path``."""
    rel = target(root, path, unprotected, protect, "edit_file")
    before = read(root, rel, path)
    text = decode(before, path)
    note = stale(root, rel, before, path)
    try:
        body, count = replace(text.body, old, new, replace_all=replace_all, path=path)
    except ToolError as exc:
        raise ToolError(f"{exc}{_hints(text, old)}{note}") from None
    return _write("edit_file", root, rel, path, before, text, body,
                  f"{count} replacement{'s' * (count != 1)}", note)


def edit_many(root: str, path: str, edits: list[dict[str, Any]],
              unprotected: tuple[str, ...], protect: tuple[str, ...]) -> str:
    """``multi_edit``: ``edits`` applied in order to the content in memory, then one write."""
    if not edits:
        raise ToolError('edits is empty: give at least one {"old": ..., "new": ...}')
    rel = target(root, path, unprotected, protect, "multi_edit")
    before = read(root, rel, path)
    text = decode(before, path)
    note = stale(root, rel, before, path)
    body, total = text.body, 0
    for i, item in enumerate(edits, 1):
        old, new = (item.get("old"), item.get("new")) if isinstance(item, dict) else (0, 0)
        try:
            if not isinstance(old, str) or not isinstance(new, str):
                raise ToolError('expected {"old": text, "new": text, "replace_all": false}')
            body, count = replace(body, old, new, replace_all=bool(item.get("replace_all")),
                                  path=path)
        except ToolError as exc:
            hint = _hints(text, old) if isinstance(old, str) else ""
            raise ToolError(f"edit {i} of {len(edits)} failed, so nothing was written: "
                            f"{exc}{hint}{note}") from None
        total += count
    return _write("multi_edit", root, rel, path, before, text, body,
                  f"{len(edits)} edit{'s' * (len(edits) != 1)}, "
                  f"{total} replacement{'s' * (total != 1)}", note)


def _write(tool: str, root: str, rel: str, path: str, before: bytes, text: Text, body: str,
           what: str, note: str) -> str:
    """Approve, check, write and record the new ``body`` of ``rel``; the model's result."""
    from dsh.core import beneath
    from dsh.tools import changes

    after = encode(text, body, path)
    approve(tool, root, rel, changes.diff_of(text.body, body, rel))
    unchanged(root, rel, before, path)
    try:
        beneath.write(root, rel, after)
    except OSError as exc:
        raise workspace._os_error(path, exc) from None
    change = changes.record(rel, before, after)
    remember_read(root, rel, after)
    return f"edited {path} ({what})\n{changes.for_model([change])}{note}"
