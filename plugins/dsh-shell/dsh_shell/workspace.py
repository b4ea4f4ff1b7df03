"""Files confined to the workspace: ``read_file`` and ``write_file``.

A path is checked twice. First by name: absolute paths are refused, and the path's *real*
path (``os.path.realpath``, which resolves symlinks and ``..`` as the kernel would) must lie
inside the workspace's real path. Then by opening, through :mod:`dsh.core.beneath`: the
checked path is resolved beneath a descriptor of the workspace with no symlink followed
(``openat2``), so a symlink swapped in between the check and the open makes the open fail
instead of escaping (a TOCTOU race), and dsh's protected paths are refused on the descriptor.
Writes refuse the project's persistence paths (``.git/config``, ``.git/hooks``, ``.claude/``,
``.mcp.json``, the instruction files, the memory file) unless ``[sandbox] unprotected``
names them.
"""

from __future__ import annotations

import codecs
import errno
import os
import stat
from typing import BinaryIO

from dsh.core.errors import ToolError


def workspace_root(path: str) -> str:
    """Check that the workspace (a real path) is a directory; return it."""
    if not os.path.isdir(path):
        raise ToolError(
            f"the workspace {path} does not exist or is not a directory "
            "(set [plugins.shell] workspace, or run dsh from the project directory)"
        )
    return path


def _inside(root: str, path: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def resolve(root: str, path: str) -> str:
    """The real path of ``path`` relative to ``root``, if it stays inside; else ToolError.

    The result has no symlinks and no ``..`` (``"."`` is the workspace itself).
    """
    if not path or not path.strip():
        raise ToolError("the path is empty: give a file path relative to the workspace")
    if "\0" in path:
        raise ToolError("the path contains a NUL byte")
    if os.path.isabs(path):
        raise ToolError(
            f"absolute paths are refused ({path!r}): give a path relative to the workspace"
        )
    real = os.path.realpath(os.path.join(root, path))
    if _inside(root, real):
        return os.path.relpath(real, root)
    # Both cases are refused; the message says which one, so the model can correct itself.
    if not _inside(root, os.path.normpath(os.path.join(root, path))):
        raise ToolError(
            f"path {path!r} leaves the workspace through '..': only files inside the "
            "workspace can be read or written"
        )
    raise ToolError(
        f"path {path!r} goes through a symlink that leads outside the workspace: refused"
    )


def _os_error(path: str, exc: OSError) -> ToolError:
    from dsh.core import beneath
    from dsh.core import files

    if isinstance(exc, beneath.Refused):
        if "symbolic link" not in exc.why:
            return ToolError(f"path {path!r} is refused: {exc.why}")
        # resolve() saw no symlink here, so one appeared since: refuse rather than follow.
        return ToolError(f"path {path!r} changed while it was being opened (a symlink "
                         "appeared in it): refused")
    if isinstance(exc, files.NotRegular):
        return ToolError(f"{path!r} is not a regular file")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR) and not isinstance(exc, FileNotFoundError):
        # resolve() saw no symlink here, so one appeared since: refuse rather than follow.
        return ToolError(f"path {path!r} changed while it was being opened (a symlink "
                         "appeared in it): refused")
    if isinstance(exc, FileNotFoundError):
        return ToolError(f"no such file in the workspace: {path!r}")
    if isinstance(exc, IsADirectoryError):
        return ToolError(f"{path!r} is a directory, not a file")
    if isinstance(exc, PermissionError):
        return ToolError(f"permission denied: {path!r}")
    return ToolError(f"cannot open {path!r}: {exc.strerror or exc}")


def read_text(root: str, path: str, *, start_line: int, max_bytes: int) -> str:
    """Up to ``max_bytes`` of the text file ``path`` from line ``start_line``, cut at a line
    boundary, with a note saying where to continue when it was cut."""
    if start_line < 1:
        raise ToolError(f"start_line must be 1 or more, not {start_line}")
    rel = resolve(root, path)
    if os.path.isdir(os.path.join(root, rel)):
        raise ToolError(f"{path!r} is a directory; list it with run_command(\"ls {path}\")")
    try:
        # O_NONBLOCK: opening a FIFO must not hang the run; it is refused below anyway.
        if rel in ("", "."):
            raise ToolError("the path is the workspace directory itself, not a file")
        from dsh.core import beneath  # imported at the first read, not on dsh's start-up

        fd = beneath.open_beneath(root, rel, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _os_error(path, exc) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"{path!r} is not a regular file")
        skipped = _skip_lines(f, start_line - 1)
        data = f.read(max_bytes + 1)
    if start_line > 1 and (skipped < start_line - 1 or not data):
        raise ToolError(f"start_line {start_line} is past the end of {path!r}")
    if b"\0" in data[:8192]:
        raise ToolError(f"{path!r} looks like a binary file ({st.st_size} bytes); "
                        "read_file returns text only")
    if len(data) <= max_bytes:
        if start_line == 1:  # the model saw the whole file: an edit can tell if it changes
            from dsh_shell import edit

            edit.remember_read(root, rel, data)
        return data.decode("utf-8", errors="replace")
    data = data[:max_bytes]
    cut = data.rfind(b"\n")
    if cut >= 0:  # end on a whole line, so the next call can start exactly after it
        data = data[: cut + 1]
    # An incremental decoder holds back a UTF-8 sequence split by the cut instead of
    # turning it into a replacement character.
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)
    lines = data.count(b"\n")
    if lines:
        shown = f"lines {start_line}-{start_line + lines - 1}"
        more = f"call read_file with start_line={start_line + lines} to continue"
    else:  # one line longer than the limit: only its beginning fits
        shown = f"the beginning of line {start_line}"
        more = (f"call read_file with start_line={start_line + 1} for the next line, or "
                "search the file with run_command(\"grep -n ...\")")
    sep = "" if text.endswith("\n") else "\n"
    return (f"{text}{sep}[read_file: cut at {max_bytes} bytes of a {st.st_size}-byte file; "
            f"showed {shown}; {more}]")


def _skip_lines(f: BinaryIO, count: int) -> int:
    """Advance the binary file ``f`` past ``count`` newlines; return how many it passed."""
    passed = 0
    while passed < count:
        chunk = f.read(64 * 1024)
        if not chunk:
            break
        start = 0
        while passed < count:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                break
            passed += 1
            start = nl + 1
        if passed == count:
            f.seek(start - len(chunk), os.SEEK_CUR)  # give back what follows the last line
    return passed


def write_text(root: str, path: str, content: str, unprotected: tuple[str, ...] = (),
               protect: tuple[str, ...] = (), *, ask: bool = False) -> str:
    """Write ``content`` to ``path``, creating parent directories.

    The file is *replaced*, never written in place: the content goes to a new file in the
    same directory, which is then renamed over the old name (atomic: a reader sees the old
    content or the new one, never half of it). So a hard link — another name of the same
    file, perhaps outside the workspace — keeps the old content, and a symlink swapped in
    for the name is replaced, not followed. The old file's permission bits are kept.

    The project's persistence paths (:data:`dsh.core.beneath.PERSISTENCE`: ``.git/config``,
    ``.git/hooks``, ``.claude/``, ``.mcp.json``, the instruction files, and ``protect``, the
    project memory file) are refused unless ``unprotected`` (``[sandbox] unprotected``)
    names them. With ``ask``, the write goes through the approval service first
    (:func:`dsh.tools.approval.request`, showing the diff it would make): the permission mode
    runs it, refuses it, or the person is asked.
    """
    rel = resolve(root, path)
    parts = [p for p in rel.split(os.sep) if p not in ("", ".")]
    if not parts:
        raise ToolError("the path is the workspace directory itself, not a file")
    from dsh_shell import edit  # the edit tools' check: every spelling, through symlinks

    shaped = edit.shapes(root, path, "/".join(parts), unprotected, protect)
    if shaped is not None:
        raise ToolError(f"{path!r} is {shaped}, a file that shapes later runs (git, dsh and "
                        "Claude Code obey it): write_file does not change it. The person may "
                        f"allow it with [sandbox] unprotected = [{shaped!r}]")
    data = content.encode("utf-8", errors="replace")
    rel = "/".join(parts)
    before, unread = old_content(root, rel, path)
    from dsh.tools import changes

    if ask:
        from dsh.tools import approval

        preview = (changes.diff_of((before or b"").decode("utf-8", "replace"), content, rel,
                                   created=before is None) if unread is None else "")
        approval.request(approval.Ask(tool="write_file", action="write", subject=rel,
                                      root=root, detail=_bounded(preview)))
    try:
        from dsh.core import beneath

        old = beneath.write(root, rel, data, create_dirs=True)
    except IsADirectoryError:
        raise ToolError(f"{path!r} is a directory; give a file path") from None
    except OSError as exc:
        raise _os_error(path, exc) from None
    change = changes.record(rel, before if old is not None else None, data, unread=unread)
    from dsh_shell import edit

    edit.remember_read(root, rel, data)  # what the model wrote is what it knows of the file
    shown = changes.for_model([change]) if change.op == "update" else ""
    diff = f"\n{shown}" if shown else ""
    if old is None:
        return f"created {path} ({len(data)} bytes)"
    linked = (f"; it had {old.st_nlink - 1} other hard link(s), which keep the old content"
              if stat.S_ISREG(old.st_mode) and old.st_nlink > 1 else "")
    return f"replaced {path} ({len(data)} bytes){linked}{diff}"


#: Bytes of an old content read to diff it; a larger file is replaced without a diff.
MAX_DIFFED = 16 << 20


def old_content(root: str, rel: str, path: str) -> tuple[bytes | None, int | None]:
    """The bytes of ``rel`` before a write (``None``: no such file) and, when it is too large
    to diff, its size instead (through the one file API, never by name)."""
    from dsh.core import beneath
    from dsh.core import files

    try:
        return beneath.read(root, rel, MAX_DIFFED), None
    except FileNotFoundError:
        return None, None
    except files.TooLarge as exc:
        return None, getattr(exc, "size", None) or MAX_DIFFED
    except IsADirectoryError:
        raise ToolError(f"{path!r} is a directory; give a file path") from None
    except files.NotRegular:
        if os.path.isdir(os.path.join(root, rel)):  # only to word the refusal
            raise ToolError(f"{path!r} is a directory; give a file path") from None
        raise ToolError(f"{path!r} is not a regular file") from None
    except OSError as exc:
        raise _os_error(path, exc) from None


def _bounded(diff: str, limit: int = 40) -> str:
    """At most ``limit`` lines of a diff, for the approval question."""
    lines = diff.splitlines()
    if len(lines) > limit:
        lines = [*lines[:limit], f"… ({len(lines) - limit} more lines of diff)"]
    return "\n".join(lines)
