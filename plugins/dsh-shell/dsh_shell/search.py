"""The workbench's search tools: ``grep``, ``glob`` and ``list_dir``, reads of the workspace.

Paths go through :func:`dsh_shell.workspace.resolve` (absolute paths, ``..`` and symbolic
links out are refused), then every folder and file is opened by descriptor beneath the
workspace (:mod:`dsh_shell.walk`): no symbolic link is ever followed, ``.gitignore`` is
respected, ``.git`` is skipped, and every result is bounded and says when it was cut. They
are reads (allowed in every permission mode, as ``read_file`` is), so they ask nothing, and
they may run concurrently.

``grep`` runs ripgrep confined by the agent's sandbox (made read-only) when ``rg`` is on
``PATH``, else dsh's own search, whose matching runs in a child process killed at the time
bound, so a catastrophic pattern cannot hang the run (:mod:`dsh_shell.grep`). The bounds are
the constants below; the time bound and the answer's size are also at most the shell's
``timeout`` and ``max_output``.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from dsh.core.errors import ToolError
from dsh_shell import workspace

if TYPE_CHECKING:
    from dsh_shell import walk as walking
    from dsh_shell.settings import ShellSettings

#: Seconds a search may take at most (less when the shell's ``timeout`` is less).
TIMEOUT = 30.0
#: Characters of a ``grep`` or ``glob`` pattern.
MAX_PATTERN = 1000
#: Folder levels walked below the start (one descriptor is held per level).
MAX_DEPTH = 64
#: Entries listed per call: a bound on the work of a walk of a huge tree.
MAX_ENTRIES = 200_000
#: Bytes of a file ``grep`` searches (a larger one is skipped with a note) and in all.
MAX_FILE = 2 << 20
MAX_TOTAL = 256 << 20
#: Characters of a line shown; the rest is cut with a note.
MAX_COLUMNS = 300
#: Bytes of a tool's answer (less when the shell's ``max_output`` is less).
MAX_BYTES = 32 * 1024
#: ``grep``'s matching lines by default and at most; ``glob``'s and ``list_dir``'s entries.
MAX_RESULTS = 100
MAX_RESULTS_LIMIT = 1000
MAX_LISTED = 500
#: Entries ``list_dir`` and ``glob`` count before they stop (the count is then a floor).
MAX_COUNTED = 20_000


def budget(settings: ShellSettings) -> tuple[float, float, int]:
    """``(seconds, deadline, bytes of an answer)`` of one call."""
    seconds = min(settings.timeout, TIMEOUT)
    return seconds, time.monotonic() + seconds, min(settings.max_output, MAX_BYTES)


def start(settings: ShellSettings, path: str) -> tuple[str, str, bool]:
    """``(workspace, path relative to it, is a folder)``; ToolError when refused."""
    root = workspace.workspace_root(settings.workspace_path())
    rel = workspace.resolve(root, path or ".")
    rel = "" if rel == "." else rel.replace(os.sep, "/")
    full = os.path.join(root, rel)
    if not os.path.lexists(full):
        raise ToolError(f"no such file or folder in the workspace: {path!r}")
    return root, rel, os.path.isdir(full)


def open_start(walker: walking.Walker, path: str) -> int:
    try:
        return walker.open_start()
    except OSError as exc:
        if isinstance(exc, NotADirectoryError):
            raise ToolError(f"{path!r} is a file, not a folder") from None
        raise workspace._os_error(path, exc) from None


def walk_notes(walker: walking.Walker, what: str) -> list[str]:
    notes = []
    if walker.stopped == "time":
        notes.append(f"out of time: {what} not seen")
    elif walker.stopped == "entries":
        notes.append(f"stopped listing after {walker.max_entries} entries: {what} not seen")
    if walker.deep and walker.max_depth == MAX_DEPTH:
        notes.append(f"{walker.deep} folder(s) at {MAX_DEPTH} levels down were not entered")
    if walker.unreadable:
        shown = ", ".join(walker.unreadable[:3]) + (", …" if len(walker.unreadable) > 3 else "")
        notes.append(f"{len(walker.unreadable)} folder(s) could not be opened ({shown})")
    return notes


def answer(lines: list[str], notes: list[str], limit: int, tool: str) -> str:
    """``lines`` cut to ``limit`` bytes, then the notes, one bracketed line."""
    out: list[str] = []
    size = 0
    for i, line in enumerate(lines):
        size += len(line.encode("utf-8", "replace")) + 1
        if size > limit:
            notes.insert(0, f"output cut at {limit} bytes: {len(lines) - i} more line(s) "
                            "not shown; narrow the search")
            break
        out.append(line)
    if notes:
        out.append(f"[{tool}: " + "; ".join(notes) + "]")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# glob and list_dir
# --------------------------------------------------------------------------------------------


def run_glob(settings: ShellSettings, pattern: str, path: str) -> str:
    from dsh_shell import walk as walking  # imported at the first call, not at start-up

    if not isinstance(pattern, str) or not pattern.strip():
        raise ToolError("the pattern is empty: give a glob such as \"**/*.py\"")
    if len(pattern) > MAX_PATTERN:
        raise ToolError(f"the pattern is {len(pattern)} characters long; at most "
                        f"{MAX_PATTERN} are accepted")
    matcher = walking.Glob(pattern)
    root, rel, is_dir = start(settings, path)
    if not is_dir:
        raise ToolError(f"{path!r} is a file, not a folder: give the folder to search in")
    _, deadline, limit = budget(settings)
    prefix = len(rel) + 1 if rel else 0
    walker = walking.Walker(root, rel, max_depth=MAX_DEPTH, max_entries=MAX_ENTRIES,
                            deadline=deadline,
                            descend=lambda e: matcher.may_hold(e.rel[prefix:]))
    lines: list[str] = []
    count = 0
    entries = walker.walk(open_start(walker, path))
    for entry in entries:
        if entry.kind != "dir" and matcher.matches(entry.rel[prefix:]):
            count += 1
            if count <= MAX_LISTED:
                lines.append(entry.rel + (" -> (symlink)" if entry.kind == "link" else ""))
            elif count >= MAX_COUNTED:
                entries.close()
                break
    notes = walk_notes(walker, "later entries")
    if count > MAX_LISTED:
        more = "at least " if walker.stopped or count >= MAX_COUNTED else ""
        notes.insert(0, f"showing {MAX_LISTED} of {more}{count} matches; narrow the pattern "
                        "or the path")
    if walker.ignored:
        notes.append(f"{walker.ignored} .gitignore'd entries skipped")
    if not lines:
        lines.append(f"no files match {pattern!r} in {path!r}")
    return answer(lines, notes, limit, "glob")


def run_list_dir(settings: ShellSettings, path: str, depth: int) -> str:
    from dsh_shell import walk as walking

    if not 1 <= depth <= 5:
        raise ToolError(f"depth must be 1 to 5, not {depth}")
    root, rel, is_dir = start(settings, path)
    if not is_dir:
        raise ToolError(f"{path!r} is a file, not a folder: read it with read_file")
    _, deadline, limit = budget(settings)
    walker = walking.Walker(root, rel, max_depth=depth, max_entries=MAX_ENTRIES,
                            deadline=deadline, git=True)
    lines = [f"{rel}/" if rel else "./"]
    count = 0
    entries = walker.walk(open_start(walker, path))
    for entry in entries:
        count += 1
        if count >= MAX_COUNTED:
            entries.close()
            break
        if count > MAX_LISTED:
            continue
        name = walking.shown(entry.name)
        suffix = {"dir": "/", "link": " -> (symlink)", "other": " (not a file)"}.get(
            entry.kind, "")
        lines.append("  " * entry.depth + name + suffix)
    notes = walk_notes(walker, "later entries")
    if count > MAX_LISTED:
        more = "at least " if walker.stopped or count >= MAX_COUNTED else ""
        notes.insert(0, f"showing {MAX_LISTED} of {more}{count} entries; list a subfolder "
                        "or lower depth")
    if walker.ignored:
        notes.append(f"{walker.ignored} .gitignore'd entries hidden")
    if count == 0:
        lines.append("  (empty)")
    return answer(lines, notes, limit, "list_dir")
