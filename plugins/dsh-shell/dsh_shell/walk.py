"""Walking a folder of the workspace by descriptor, for ``grep``, ``glob`` and ``list_dir``.

The start folder is opened through :mod:`dsh.core.beneath` (beneath the workspace, no
symbolic link followed, dsh's protected paths refused); every folder below it is opened from
its parent's descriptor by :func:`dsh.core.beneath.open_beneath` with one component, so a
symbolic link swapped in for a folder mid-walk makes that open fail (the folder is skipped)
instead of leading anywhere. A symbolic link is yielded as an entry and never entered.

``.gitignore`` files are read on the way (the workspace's and every folder's from the
workspace down, plus ``.git/info/exclude``) and matched as git does (``pathspec``'s
``GitIgnoreSpec``; a deeper file wins, the last matching line of a file wins, ``!`` negates);
an ignored folder is not entered, so a negation cannot bring back a file under it, as in git.
A start folder that the rules above it ignore was named on purpose: it is walked, and only
the rules from it downwards apply. ``.git`` is never entered.

Entries come in the order of their paths sorted as strings (siblings sorted by name, a
folder ``a`` as ``a/``), so a walk's output needs no sort and a bound cuts a sorted list. The
walk is bounded in entries listed, depth (one descriptor is held per level) and time;
:attr:`Walker.stopped` says which bound ended it.

:class:`Glob` is the ``glob`` tool's matcher (anchored, ``**``, braces), which also tells the
walk which folders cannot hold a match; :func:`glob_filter` is ``grep``'s ``glob`` (rg's
syntax: a glob without '/' matches at any depth).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from collections.abc import Generator
from typing import Any
from typing import NamedTuple

#: Bytes of a ``.gitignore`` read; a larger one is not used.
IGNORE_CAP = 1 << 20


class Entry(NamedTuple):
    """One entry of a walk. ``rel`` is its path relative to the workspace ('/'-separated,
    made printable); ``name`` the raw name to open it by from ``dfd``, the descriptor of the
    folder holding it (valid until the walk moves on); ``kind`` ``dir``, ``file``, ``link``
    or ``other``; ``depth`` 1 for an entry directly in the start folder."""

    rel: str
    name: str
    kind: str
    depth: int
    dfd: int


def shown(name: str) -> str:
    """A file name as text the model can read: undecodable bytes replaced, control
    characters (a newline that would forge an output line) made visible."""
    from dsh.core.escape import escape_controls

    text = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return escape_controls(text, newlines=False)


def _compile(data: bytes) -> Any:
    import pathspec

    lines = data.decode("utf-8", "replace").splitlines()
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except Exception:  # noqa: BLE001 - one malformed line: keep the others, as git does
        good = []
        for line in lines:
            try:
                pathspec.GitIgnoreSpec.from_lines([line])
            except Exception:  # noqa: BLE001
                continue
            good.append(line)
        return pathspec.GitIgnoreSpec.from_lines(good)


def _verdict(spec: Any, path: str) -> bool | None:
    """True: ``path`` is ignored by ``spec``; False: re-included by a ``!`` line; None: no
    line matches it."""
    check = getattr(spec, "check_file", None)
    if check is not None:
        return check(path).include
    hit = None
    for pattern in spec.patterns:  # pathspec < 0.12: the last matching line decides
        if pattern.include is not None and pattern.match_file(path) is not None:
            hit = pattern.include
    return hit


def _read_rules(dfd: int | str, rel: str) -> Any:
    from dsh.core import beneath

    try:
        data = beneath.read(dfd, rel, IGNORE_CAP)
    except OSError:  # missing, too large, a symbolic link (git does not follow one either)
        return None
    return _compile(data) if data.strip() else None


class _Frame:
    __slots__ = ("depth", "fd", "i", "items", "rel", "rules")

    def __init__(self, fd: int, rel: str, depth: int, items: list[tuple[str, str, str]],
                 rules: int) -> None:
        self.fd, self.rel, self.depth, self.items, self.i = fd, rel, depth, items, 0
        self.rules = rules  # how many ignore files this folder added to the stack


class Walker:
    """A walk of the folder ``start`` (relative to the workspace ``root``, a real path).

    ``max_depth``: entries deeper than it are not listed (folders at that depth are yielded,
    not entered; :attr:`deep` counts them); ``max_entries`` and ``deadline`` (a
    ``time.monotonic`` value) bound the work; ``descend(entry)`` may refuse to enter a
    folder; ``git``: yield ``.git`` as an entry (never entered). After the walk,
    :attr:`ignored` counts the entries ``.gitignore`` hid, :attr:`unreadable` the folders
    that could not be opened, and :attr:`stopped` is ``"entries"`` (no folder was listed
    past that bound; what was listed is still yielded) or ``"time"`` (the walk ended there)
    when a bound cut it, "" when it was complete."""

    def __init__(self, root: str, start: str, *, max_depth: int, max_entries: int,
                 deadline: float, descend: Callable[[Entry], bool] | None = None,
                 git: bool = False, gitignore: bool = True) -> None:
        self.root = root
        self.start = "" if start in ("", ".") else start.replace(os.sep, "/")
        self.max_depth, self.max_entries, self.deadline = max_depth, max_entries, deadline
        self.descend, self.git, self.gitignore = descend, git, gitignore
        self.ignored = 0
        self.deep = 0
        self.listed = 0
        self.unreadable: list[str] = []
        self.stopped = ""
        self._rules: list[tuple[str, Any]] = []  # (base relative to the workspace, spec)

    def open_start(self) -> int:
        """A descriptor of the start folder; the caller's OSError when it cannot be opened."""
        from dsh.core import beneath

        return beneath.open_dir(self.root, self.start)

    def _load_above(self) -> None:
        """The ignore files from the workspace down to the start folder (not included)."""
        from dsh.core import beneath

        parts = [p for p in self.start.split("/") if p]
        rules: list[tuple[str, Any]] = []
        exclude = _read_rules(self.root, ".git/info/exclude")
        if exclude is not None:
            rules.append(("", exclude))
        for i in range(len(parts)):
            base = "/".join(parts[:i])
            try:
                fd = beneath.open_dir(self.root, base)
            except OSError:
                break
            try:
                spec = _read_rules(fd, ".gitignore")
            finally:
                os.close(fd)
            if spec is not None:
                rules.append((base, spec))
        self._rules = rules
        if rules and parts and self._is_ignored(self.start, True):
            self._rules = []  # named on purpose: walked, under its own rules only

    def _is_ignored(self, rel: str, is_dir: bool) -> bool:
        for base, spec in reversed(self._rules):
            sub = rel[len(base) + 1:] if base else rel
            verdict = _verdict(spec, sub + "/" if is_dir else sub)
            if verdict is not None:
                return verdict
        return False

    def _list(self, fd: int) -> list[tuple[str, str, str]]:
        """``(sort key, raw name, kind)`` of the folder open on ``fd``, sorted, within the
        bound of entries listed."""
        items: list[tuple[str, str, str]] = []
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if self.listed >= self.max_entries:
                        self.stopped = "entries"
                        break
                    self.listed += 1
                    try:
                        if e.is_symlink():
                            kind = "link"
                        elif e.is_dir(follow_symlinks=False):
                            kind = "dir"
                        elif e.is_file(follow_symlinks=False):
                            kind = "file"
                        else:
                            kind = "other"
                    except OSError:  # gone since the listing
                        continue
                    key = shown(e.name)
                    items.append((key + "/" if kind == "dir" else key, e.name, kind))
        except OSError:
            return items
        items.sort()
        return items

    def _push(self, stack: list[_Frame], fd: int, rel: str, depth: int) -> None:
        added = 0
        if self.gitignore:
            spec = _read_rules(fd, ".gitignore")
            if spec is not None:
                self._rules.append((rel, spec))
                added = 1
        stack.append(_Frame(fd, rel, depth, self._list(fd), added))

    def walk(self, fd: int) -> Generator[Entry, None, None]:
        """The entries beneath the start folder open on ``fd`` (this walk closes it)."""
        from dsh.core import beneath

        if self.gitignore:
            self._load_above()
        stack: list[_Frame] = []
        try:
            self._push(stack, fd, self.start, 0)
        except BaseException:
            os.close(fd)
            raise
        try:
            while stack and self.stopped != "time":
                frame = stack[-1]
                if frame.i >= len(frame.items):
                    stack.pop()
                    os.close(frame.fd)
                    del self._rules[len(self._rules) - frame.rules:]
                    continue
                key, name, kind = frame.items[frame.i]
                frame.i += 1
                if time.monotonic() > self.deadline:
                    self.stopped = "time"
                    break
                label = key[:-1] if kind == "dir" else key
                rel = f"{frame.rel}/{label}" if frame.rel else label
                entry = Entry(rel, name, kind, frame.depth + 1, frame.fd)
                if name == ".git":  # a repository's, or a worktree's .git file
                    if self.git:
                        yield entry
                    continue
                if self.gitignore and self._rules and self._is_ignored(rel, kind == "dir"):
                    self.ignored += 1
                    continue
                yield entry
                if kind != "dir" or (self.descend is not None and not self.descend(entry)):
                    continue
                if entry.depth >= self.max_depth:
                    self.deep += 1
                    continue
                if self.stopped:  # out of entries: what was listed is still yielded
                    continue
                try:
                    sub = beneath.open_beneath(frame.fd, name, os.O_RDONLY | os.O_DIRECTORY)
                except OSError:  # vanished, unreadable, a symlink swapped in, protected
                    self.unreadable.append(rel)
                    continue
                try:
                    self._push(stack, sub, rel, entry.depth)
                except BaseException:
                    os.close(sub)
                    raise
        finally:
            for frame in stack:
                os.close(frame.fd)


#: Alternatives a glob's braces may expand to.
MAX_ALTERNATIVES = 64


class Glob:
    """A glob over paths relative to its folder: ``*`` and ``?`` within one component,
    ``[abc]`` / ``[!abc]``, ``{a,b}`` alternatives, ``**`` as a whole component for any
    number of folders (none included). Names starting with a dot match like any other."""

    def __init__(self, pattern: str) -> None:
        import re

        from dsh.core.errors import ToolError

        text = pattern.strip().removeprefix("./")
        if text.startswith("/"):
            raise ToolError(f"the glob {pattern!r} is absolute: give it relative to path")
        alternatives = _expand(text)
        if len(alternatives) > MAX_ALTERNATIVES:
            raise ToolError(f"the glob {pattern!r} expands to more than {MAX_ALTERNATIVES} "
                            "alternatives")
        self.parts: list[list[Any]] = []
        whole = []
        for alt in alternatives:
            segs = [s for s in alt.split("/") if s not in ("", ".")]
            if ".." in segs:
                raise ToolError(f"the glob {pattern!r} leaves its folder through '..'")
            parts = ["**" if s == "**" else re.compile(_segment(s)) for s in segs]
            self.parts.append(parts)
            regex = ""
            for i, s in enumerate(segs):
                last = i == len(segs) - 1
                if s == "**":
                    regex += ".*" if last else "(?:[^/]+/)*"
                else:
                    regex += _segment(s) + ("" if last else "/")
            whole.append(f"(?:{regex})")
        self.regex = re.compile("|".join(whole) or "(?!)")

    def matches(self, rel: str) -> bool:
        """Whether the path ``rel`` (relative to the glob's folder) matches."""
        return self.regex.fullmatch(rel) is not None

    def may_hold(self, rel: str) -> bool:
        """Whether the folder ``rel`` may hold a match (else it is not entered)."""
        names = rel.split("/")
        for parts in self.parts:
            for i, name in enumerate(names):
                if i < len(parts) and parts[i] == "**":
                    return True
                if i >= len(parts) - 1 or parts[i].fullmatch(name) is None:
                    break  # the folder stands where the file's name is, or differs
            else:
                return True
        return False


def _segment(seg: str) -> str:
    """The regex of one glob component."""
    import re

    out = []
    i = 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = seg.find("]", i + 2 if seg[i + 1:i + 2] in ("!", "^") else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = seg[i + 1:end]
                neg = body[:1] in ("!", "^")
                body = body[1:] if neg else body
                out.append("[" + ("^/" if neg else "") + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _expand(text: str) -> list[str]:
    """``{a,b}`` alternatives expanded (nested braces too), at most one more than
    :data:`MAX_ALTERNATIVES` of them."""
    start = text.find("{")
    if start < 0:
        return [text]
    depth, cut, options = 0, start + 1, []
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                options.append(text[cut:i])
                head, tail = text[:start], text[i + 1:]
                out: list[str] = []
                for option in options:
                    for more in _expand(head + option + tail):
                        out.append(more)
                        if len(out) > MAX_ALTERNATIVES:
                            return out
                return out
        elif text[i] == "," and depth == 1:
            options.append(text[cut:i])
            cut = i + 1
    return [text]  # an unclosed brace is literal


def glob_filter(glob: str | None) -> Callable[[str], bool] | None:
    """rg's ``--glob``: gitignore syntax (no '/': any depth), a leading '!' excludes."""
    if glob is None:
        return None
    import pathspec

    from dsh.core.errors import ToolError

    negate = glob.startswith("!")
    try:
        spec = pathspec.GitIgnoreSpec.from_lines([glob[1:] if negate else glob])
    except Exception as exc:  # noqa: BLE001 - pathspec's error types vary by version
        raise ToolError(f"invalid glob {glob!r}: {exc}") from None
    return lambda rel: bool(spec.match_file(rel)) != negate
