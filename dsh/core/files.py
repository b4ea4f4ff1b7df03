"""Reading files a user or a plugin names: only regular files, within a size cap.

One reader for ledgers, attachments and schema files. A FIFO is opened without blocking and
refused before any read (a ``*.jsonl`` or ``schema.json`` that is a pipe would otherwise
hang the command); the size is checked on the open descriptor, then reading stops just past
the cap (``/proc`` files report size 0). Each caller turns :class:`NotRegular`,
:class:`TooLarge` and other :class:`OSError` into its own error naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

_CHUNK = 1 << 20

#: A project's files that shape later runs, relative to its root: the git directory (git
#: runs its config's ``core.fsmonitor`` and its hooks on its own; ``.git/commondir`` and the
#: index can point it at other configs, so only all of ``.git`` closes the class), what dsh
#: and Claude Code obey or put into prompts (``.claude/``, ``.mcp.json``, the instruction
#: files) and dsh's own project folder. The sandbox makes them read-only inside a writable
#: workspace and dsh-shell's writes refuse them, unless ``[sandbox] unprotected`` names them
#: (``unprotected = [".git"]`` lets commands commit); dsh's readers trust them only by content.
PERSISTENCE: tuple[str, ...] = (".git", ".claude", ".mcp.json", "AGENTS.md", "CLAUDE.md",
                                "CLAUDE.local.md", ".dsh")


class NotRegular(OSError):
    """The path is not a regular file; ``kind`` says what it is (``a directory``, …)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class TooLarge(OSError):
    """The file holds more than the cap: ``size`` bytes when its size said so (``exact``),
    else reading went past the cap (a file whose reported size is 0, such as under /proc)."""

    def __init__(self, size: int, exact: bool) -> None:
        super().__init__(f"{size} bytes")
        self.size = size
        self.exact = exact


def reason(exc: OSError) -> str:
    """An OS error as a short phrase: ``permission denied``, ``no space left on device``."""
    if exc.errno is None:
        return str(exc)
    text = os.strerror(exc.errno)
    return text[:1].lower() + text[1:]


def kind_of(mode: int) -> str:
    """What a non-regular file is, for a message."""
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "a device")


def read_regular(path: str | os.PathLike[str], cap: int | None = None) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed, as any program opening a
    path does). Raises :class:`FileNotFoundError`, :class:`NotRegular`, :class:`TooLarge`
    (more than ``cap`` bytes, checked before reading and while reading) or another
    :class:`OSError`."""
    fd = os.open(Path(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        return read_fd(fd, cap)
    finally:
        os.close(fd)


def read_fd(fd: int, cap: int | None) -> bytes:
    """The bytes of the regular file open on ``fd``, read with :func:`read_regular`'s bound:
    :class:`NotRegular`, or :class:`TooLarge` by its size or while reading."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(kind_of(st.st_mode))
    if cap is not None and st.st_size > cap:
        raise TooLarge(st.st_size, exact=True)
    limit = cap + 1 if cap is not None else None
    chunks = []
    total = 0
    while limit is None or total < limit:
        chunk = os.read(fd, _CHUNK if limit is None else min(_CHUNK, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if cap is not None and total > cap:
        raise TooLarge(total, exact=False)
    return b"".join(chunks)


def read_json(path: str | os.PathLike[str], cap: int) -> object:
    """A JSON file a user or a plugin folder supplies, read with :func:`read_regular`'s bound
    (a FIFO or ``/dev/zero`` is refused instead of blocking). :class:`FileNotFoundError` when it
    is missing; every other problem a :class:`~dsh.core.errors.ConfigError` naming the file."""
    from dsh.core.errors import ConfigError

    try:
        data = read_regular(path, cap)
    except FileNotFoundError:
        raise
    except NotRegular as exc:
        raise ConfigError(f"{path}: cannot read: it is {exc.kind}, not a regular file") from None
    except TooLarge:
        raise ConfigError(f"{path}: cannot read: larger than {cap} bytes") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {reason(exc)}") from None
    return parse_json(data, path)


def parse_json(data: bytes, path: str | os.PathLike[str]) -> object:
    """``data`` (a file's bytes, already read) as JSON; a
    :class:`~dsh.core.errors.ConfigError` naming ``path`` when it is not UTF-8 or not JSON."""
    import json

    from dsh.core.errors import ConfigError

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: not valid JSON: nested too deeply") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None


def inside_folder(root: str, rel: str, key: str) -> str:
    """``rel`` resolved in the folder ``root`` (symbolic links followed), for the paths a
    plugin folder's manifest names: a :class:`~dsh.core.errors.ConfigError` naming ``key``
    when it is absolute or leads out of the folder."""
    from dsh.core.errors import ConfigError

    if os.path.isabs(rel):
        raise ConfigError(f"{key}: {rel!r} is an absolute path; a plugin's paths are "
                          "relative to its folder")
    path = os.path.realpath(os.path.join(root, rel))
    if os.path.commonpath([root, path]) != root:
        raise ConfigError(f"{key}: {rel!r} leads out of the plugin folder {root} (to {path})")
    return path


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory's entries durable: a file just created or renamed into it survives a
    power cut. Raises :class:`OSError` for the caller to name."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
