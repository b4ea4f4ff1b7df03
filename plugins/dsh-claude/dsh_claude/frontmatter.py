"""Reading a project's Markdown files: one reader that follows no link the workspace left, and a
frontmatter parser that is safe by construction.

**The reader** (:func:`read_beneath`, and :func:`read_text` for a path) is the only way
dsh-claude reads AGENTS.md, CLAUDE.md and their ``@imports``, SKILL.md and skill resources,
command and agent files and plugin manifests. It goes through :mod:`dsh.core.beneath`: the file
is opened *relative to a root folder's descriptor* (the project root for a project's files, the
user's Claude folder for the user's), in one kernel call that refuses a ``..``, an absolute path
and **any symbolic link on the way** — and the bytes are read from that descriptor, never from
a second open by name, so no check-then-use race can swap a file for a link to a secret. dsh's
protected paths (its config and key store, its session store, ``~/.ssh``, ``~/.aws`` …) are
refused whatever the path. A FIFO, a device, a directory or a socket is refused before any
read, the size is capped before and while reading. The bytes must be UTF-8 text without NUL
(a binary file is refused, naming the byte). Every refusal is a :class:`ClaudeFileError`
naming the file and what is wrong with it. Claude Code follows symbolic links in a project;
dsh does not, for any file a confined command may have written.

**The frontmatter** (:func:`parse`) is a YAML block between a first line ``---`` and the
next line ``---`` (or ``...``), then the Markdown body. It is parsed with PyYAML's
``BaseLoader`` (every scalar stays a string; no type resolution, no Python object is ever
built) extended to refuse, at the first event that has one:

* **anchors and aliases** (``&a`` / ``*a``): the only way YAML text of a few hundred bytes
  expands to gigabytes (the "billion laughs" bomb). No real frontmatter needs them.
* **tags** (``!!python/object``, ``!custom``, even ``!!str``): tags are how YAML loaders are
  made to build objects; refused whatever the loader would do with them.
* **nesting deeper than** :data:`MAX_DEPTH` (the composer recurses: ``[[[[…`` would otherwise
  end in a ``RecursionError``), a block over :data:`MAX_FRONTMATTER` bytes, a key that is
  not a string, and a key given twice (YAML says duplicates are an error; PyYAML keeps the
  last one silently — a second ``allowed-tools`` would hide the first).

Why PyYAML this way and not ``yaml.safe_load``: ``SafeLoader`` builds no arbitrary objects
but still expands aliases (the bomb) and turns ``yes``/``no``/``on``/``2024-01-01`` into
booleans and dates (YAML 1.1), so a description ``no`` would become ``False``. Strings only
is what the formats here expect; :func:`as_bool` reads the few boolean keys. PyYAML is
well kept, pure Python where we use it, and already the reference YAML library for Python;
a stricter parser (StrictYAML) would pull ruamel.yaml in and is less kept. It is a
dependency of this plugin only and imported only when a file with frontmatter is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from dsh.core.errors import ConfigError

#: The largest file read (AGENTS.md, CLAUDE.md, SKILL.md, a skill resource), in bytes.
MAX_FILE = 256 * 1024
#: The largest frontmatter block, in bytes.
MAX_FRONTMATTER = 64 * 1024
#: The deepest nesting of lists and mappings in a frontmatter block.
MAX_DEPTH = 16


class ClaudeFileError(ConfigError):
    """A project file (AGENTS.md, CLAUDE.md, SKILL.md, a command or agent file) cannot be
    used: the message is one line naming the file and the key or line. Exit code 2 (as every
    configuration error) when it stops a command; during a run the file is skipped with a
    warning on stderr instead."""

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem


@attrs.frozen
class Document:
    """A parsed file: ``meta`` (the frontmatter, strings, lists and dicts of them; ``{}``
    without frontmatter), ``body`` (the text after it) and ``body_line`` (the file's line
    number where the body starts, 1-based)."""

    path: str
    meta: dict[str, Any]
    body: str
    body_line: int = 1


def inside(path: Path, roots: Iterable[Path]) -> bool:
    """Whether ``path`` is one of ``roots`` or under one (by name: no link is resolved)."""
    from dsh.core.beneath import within

    text = os.path.normpath(os.path.abspath(path))
    return any(within(text, os.path.normpath(os.path.abspath(r))) for r in roots)


def locate(path: str | os.PathLike[str],
           roots: Iterable[str | os.PathLike[str]]) -> tuple[str, str] | None:
    """``(root, rel)``: the first of ``roots`` that ``path`` lies beneath, by name, and the
    path relative to it (``..`` folded by name: no link is ever followed below a root, so the
    name is where the kernel will look). ``None`` when it lies beneath none of them."""
    from dsh.core.beneath import within

    full = os.path.normpath(os.path.abspath(os.fspath(path)))
    for root in roots:
        base = os.path.normpath(os.path.abspath(os.fspath(root)))
        if within(full, base):
            return base, os.path.relpath(full, base)
    return None


def read_beneath(root: str | os.PathLike[str] | int, rel: str, cap: int = MAX_FILE, *,
                 shown: str | os.PathLike[str] | None = None) -> bytes:
    """The bytes of the regular file ``rel`` beneath the folder ``root`` (a path or a
    descriptor), read from the descriptor :func:`dsh.core.beneath.open_beneath` opened: no
    ``..``, no absolute path, no symbolic link anywhere below ``root``, none of dsh's
    protected paths; at most ``cap`` bytes.

    :raises ClaudeFileError: naming ``shown`` (default: ``root/rel``)."""
    from dsh.core import beneath
    from dsh.core.files import NotRegular
    from dsh.core.files import TooLarge
    from dsh.core.files import reason

    name = shown if shown is not None else (
        rel if isinstance(root, int) else os.path.join(os.fspath(root), rel))
    try:
        return beneath.read(root, rel, cap)
    except beneath.Refused as exc:
        raise ClaudeFileError(name, f"{exc.why}: not read") from None
    except NotRegular as exc:
        raise ClaudeFileError(name, f"is {exc.kind}, not a regular file: not read") from None
    except TooLarge as exc:
        size = f"{exc.size} bytes" if exc.exact else f"more than {cap} bytes"
        raise ClaudeFileError(name, f"is {size}; the limit is {cap}: not read") from None
    except (FileNotFoundError, NotADirectoryError):
        raise ClaudeFileError(name, "does not exist") from None
    except OSError as exc:
        raise ClaudeFileError(name, f"cannot be read: {reason(exc)}") from None


def decode(data: bytes, shown: str | os.PathLike[str]) -> str:
    """``data`` as UTF-8 text (a leading BOM dropped); binary or not UTF-8 is refused."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise ClaudeFileError(shown, f"is binary (a NUL byte at offset {nul}): not read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ClaudeFileError(shown, f"is not UTF-8 text (byte {exc.start}): not read") from None
    return text.removeprefix("\ufeff")


def read_file(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]],
              cap: int = MAX_FILE, *, follow: bool = False) -> bytes:
    """The bytes of the file at ``path``, read beneath the first of ``roots`` it lies in
    (:func:`read_beneath`); a path beneath none of them is refused unread.

    ``follow``, for the person's own folders only (``~/.claude``, never a project's): a file
    there that is a link (into a dotfiles checkout) is resolved once and read beneath its real
    folder — still by descriptor, still never a protected path."""
    roots = list(roots)
    found = locate(path, roots)
    if found is None:
        where = ", ".join(str(r) for r in roots) or "no allowed folder"
        raise ClaudeFileError(path, f"leads outside the folders it may be read from "
                                    f"({where}): not read")
    if follow:
        real = os.path.realpath(path)
        found = (os.path.dirname(real), os.path.basename(real))
    return read_beneath(found[0], found[1], cap, shown=path)


def read_text(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]],
              cap: int = MAX_FILE, *, follow: bool = False) -> str:
    """The UTF-8 text of the regular file at ``path``, read beneath the first of ``roots``
    it lies in (no symbolic link followed below it); at most ``cap`` bytes. A leading BOM is
    dropped.

    :raises ClaudeFileError: missing, not a regular file, too large, outside the roots, a
        symbolic link on the way, a protected path, binary (a NUL byte) or not UTF-8 —
        naming the file."""
    return decode(read_file(path, roots, cap, follow=follow), path)


def _split(text: str, shown: str) -> tuple[str | None, str, int]:
    """(frontmatter block or None, body, body's first line number)."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n").rstrip() != "---":
        return None, text, 1
    for i in range(1, len(lines)):
        if lines[i].rstrip("\r\n").rstrip() in ("---", "..."):
            return "".join(lines[1:i]), "".join(lines[i + 1:]), i + 2
    raise ClaudeFileError(shown, "line 1: the frontmatter opened by '---' is never closed "
                                 "by a '---' line")


def _loader_class() -> type:
    import yaml  # type: ignore[import-untyped, unused-ignore]
    from yaml.events import AliasEvent  # type: ignore[import-untyped, unused-ignore]

    class StrictLoader(yaml.BaseLoader):
        """BaseLoader (strings only) refusing aliases, anchors, tags and deep nesting."""

        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            line = event.start_mark.line + 1 if event.start_mark else 0
            if isinstance(event, AliasEvent):
                raise _Refused(line, f"an alias (*{event.anchor}): anchors and aliases are "
                                     "not allowed in frontmatter")
            anchor = getattr(event, "anchor", None)
            if anchor is not None:
                raise _Refused(line, f"an anchor (&{anchor}): anchors and aliases are not "
                                     "allowed in frontmatter")
            tag = getattr(event, "tag", None)
            if tag is not None and tag != "!":
                raise _Refused(line, f"a tag ({tag}): tags are not allowed in frontmatter")
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise _Refused(line, f"nesting deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return StrictLoader


class _Refused(Exception):
    def __init__(self, line: int, problem: str) -> None:
        super().__init__(problem)
        self.line = line
        self.problem = problem


def _value(node: Any, offset: int, shown: str) -> Any:
    """Plain data from a composed node: str, list, dict (string keys, no duplicates)."""
    from yaml.nodes import MappingNode  # type: ignore[import-untyped, unused-ignore]
    from yaml.nodes import ScalarNode  # type: ignore[import-untyped, unused-ignore]
    from yaml.nodes import SequenceNode  # type: ignore[import-untyped, unused-ignore]

    if isinstance(node, ScalarNode):
        return str(node.value)
    if isinstance(node, SequenceNode):
        return [_value(item, offset, shown) for item in node.value]
    if isinstance(node, MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + offset
            if not isinstance(key_node, ScalarNode):
                kind = "list" if isinstance(key_node, SequenceNode) else "mapping"
                raise ClaudeFileError(shown, f"line {line}: a key must be text, not a {kind}")
            key = str(key_node.value)
            if key in out:
                raise ClaudeFileError(shown, f"line {line}: key {key!r} is given twice")
            out[key] = _value(value_node, offset, shown)
        return out
    raise ClaudeFileError(shown, f"line {node.start_mark.line + offset}: unexpected YAML node")


def parse(text: str, path: str | os.PathLike[str]) -> Document:
    """Split ``text`` (the content of ``path``, for messages) into frontmatter and body.

    :raises ClaudeFileError: an unclosed block, a block over :data:`MAX_FRONTMATTER` bytes,
        YAML that is invalid or refused (anchors, aliases, tags, deep nesting, duplicate or
        non-text keys), or frontmatter that is not a mapping — naming the file and line."""
    shown = str(path)
    block, body, body_line = _split(text, shown)
    if block is None:
        return Document(shown, {}, body, 1)
    size = len(block.encode("utf-8"))
    if size > MAX_FRONTMATTER:
        raise ClaudeFileError(shown, f"the frontmatter is {size} bytes; the limit is "
                                     f"{MAX_FRONTMATTER}")
    if not block.strip():
        return Document(shown, {}, body, body_line)
    import yaml  # type: ignore[import-untyped, unused-ignore]

    offset = 2  # the block's first line is the file's line 2; marks are 0-based
    loader = None
    try:
        loader = _loader_class()(block)  # checks the characters: a ReaderError
        node = loader.get_single_node()
    except _Refused as exc:
        raise ClaudeFileError(shown, f"line {exc.line + 1}: the frontmatter has "
                                     f"{exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + offset}: " if mark is not None else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise ClaudeFileError(shown, f"{where}invalid YAML in the frontmatter: {problem}") \
            from None
    except yaml.reader.ReaderError as exc:
        raise ClaudeFileError(shown, f"the frontmatter holds the character #x{exc.character:04x}"
                                     ", which YAML does not allow") from None
    except yaml.YAMLError as exc:
        first = " ".join(str(exc).split())[:200] or "error"
        raise ClaudeFileError(shown, f"invalid YAML in the frontmatter: {first}") from None
    except RecursionError:
        raise ClaudeFileError(shown, f"frontmatter nests deeper than {MAX_DEPTH} levels") \
            from None
    finally:
        if loader is not None:
            loader.dispose()
    if node is None:
        return Document(shown, {}, body, body_line)
    meta = _value(node, offset, shown)
    if not isinstance(meta, dict):
        kind = "a list" if isinstance(meta, list) else "text"
        raise ClaudeFileError(shown, f"line 2: the frontmatter must be a mapping of keys, "
                                     f"not {kind}")
    return Document(shown, meta, body, body_line)


def load(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]],
         cap: int = MAX_FILE, *, follow: bool = False) -> Document:
    """:func:`read_text` then :func:`parse`."""
    return parse(read_text(path, roots, cap, follow=follow), path)


def load_bytes(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]],
               cap: int = MAX_FILE, *, follow: bool = False) -> tuple[bytes, Document]:
    """:func:`load`, with the bytes read (what a trust decision is about)."""
    data = read_file(path, roots, cap, follow=follow)
    return data, parse(decode(data, path), path)


# ------------------------------------------------------------------------ trust

_gated: dict[tuple[str, str, str], bool] = {}


def gate(root: str | os.PathLike[str], rel: str, data: bytes, kind: str,
         summary: str = "") -> bool:
    """:func:`dsh.config.trust.gate`, asked at most once per process for the same bytes (a
    turn reads a command or plugin folder many times; a question answered no is not asked
    again, and its one line on stderr is not repeated)."""
    from dsh.config import trust

    key = (trust.key_of(root, rel), trust.digest(data), kind)
    held = _gated.get(key)
    if held is None:
        held = _gated[key] = trust.gate(root, rel, data, kind, summary)
    return held


def trusted(root: str | os.PathLike[str], rel: str, data: bytes) -> bool:
    """Whether ``data`` are the approved bytes of ``rel`` (no question, no note)."""
    from dsh.config import trust

    try:
        return trust.state(root, rel, data) == "trusted"
    except ConfigError:
        return False


def in_project(path: str | os.PathLike[str], project: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies in the project (by name): a file a confined command may have
    written, so one that shapes execution is trusted only by content."""
    return locate(path, [project]) is not None


def as_bool(value: Any, key: str, path: str) -> bool:
    """A frontmatter boolean (``true``/``false``, any case; ``yes``/``no`` too)."""
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0", ""):
        return False
    raise ClaudeFileError(path, f"key {key!r}: expected true or false, not {value!r}")
