"""Trust by content: project files that shape execution take effect only once the person
approved their exact bytes (docs/security.md, "Workspace trust").

A project's ``.mcp.json`` launches servers, its ``.claude/settings*.json`` runs hooks, its
``.claude/agents/*.md`` chooses a model and a system prompt, a command file may run
`` !`cmd` ``, the project memory file goes into every prompt. Any of them may have been
written by a confined command, a ``git pull`` or a model. Like ``direnv allow``, dsh keeps the
SHA-256 of each approved file in its own config directory (``trust.json`` beside the key
store, a directory no sandboxed process is granted), keyed by the project's real path and the
file's path in it; a file whose bytes differ from what was approved is **inert**.

:func:`gate` is the one call every reader makes with the bytes it read (the bytes it will
use, never a re-read by name). When the digest is approved it answers ``True``. Otherwise,
on a terminal, it asks once, showing what the file would do; without one, or when the answer
is no, it writes one line to stderr naming the file and ``dsh trust approve``, and answers
``False``. Every answer of this process is kept (:func:`decisions`) and recorded on the next
``turn/start`` (``trust``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dsh.core.errors import ConfigError

#: What kinds of file are trusted by content, and what each shapes (for messages).
KINDS = {
    "mcp": "launches MCP servers",
    "hooks": "runs hook commands",
    "agent": "defines an agent (its model, tools and system prompt)",
    "command": "runs shell commands when the command is used",
    "memory": "goes into every prompt as project memory",
    "plugin": "adds a plugin folder (hooks, servers, skills)",
    "instructions": "goes into every prompt as project instructions",
}
CAP = 4 << 20
_lock = threading.Lock()
_decisions: dict[str, dict[str, Any]] = {}
_noted: set[tuple[str, str]] = set()
#: Where questions are asked; tests and embedders may point it elsewhere.
TTY = "/dev/tty"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def trust_path() -> Path:
    """``$XDG_CONFIG_HOME/dsh/trust.json``: beside the key store, never in a workspace."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(xdg) / "dsh" / "trust.json"


def key_of(root: str | os.PathLike[str], rel: str) -> str:
    """The record's key: the file's absolute path, its folder's links resolved."""
    return os.path.join(os.path.realpath(root), os.path.normpath(rel))


def read_record(path: str | os.PathLike[str]) -> object:
    """A record dsh keeps of the person's decisions (trust, grants): JSON, refused — a
    :class:`ConfigError` naming the file — when it is a symbolic link, belongs to another
    user or others may write it (then it is not the person's decision). FileNotFoundError
    when it is missing."""
    import stat

    from dsh.core import files

    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{path}: is a symbolic link; dsh keeps the person's decisions in a "
                          "real file (remove it to start afresh)")
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        raise ConfigError(f"{path}: belongs to another user (uid {st.st_uid}); not used")
    if st.st_mode & 0o022:
        raise ConfigError(f"{path}: others may write it (mode {stat.S_IMODE(st.st_mode):o}); "
                          f"not used until it is private: chmod 600 {path}")
    return files.read_json(path, CAP)


def load() -> dict[str, dict[str, Any]]:
    """``{path: {"sha256", "kind", "approved"}}``; ``{}`` when nothing is trusted."""
    path = trust_path()
    try:
        data = read_record(path)
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise ConfigError(f"{path}: not a dsh trust file (want {{\"version\": 1, "
                          "\"files\": {...}}); move it away to start afresh")
    return data["files"]


def update_record(path: str | os.PathLike[str], key: str, load_now: Any, change: Any) -> Any:
    """Apply ``change(held) -> result`` to the record at ``path`` (``held`` is
    ``load_now()``, its ``key`` table) under a lock beside it, then write it back atomically
    (a private temporary file renamed over it): the one way dsh writes the person's
    decisions (trust, grants)."""
    import fcntl
    import tempfile

    folder = os.path.dirname(os.fspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    name = os.path.basename(os.fspath(path))
    lock = os.open(os.path.join(folder, f".{name}.lock"),
                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held = load_now()
        result = change(held)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".tmp")  # 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": 1, key: held}, f, indent=1, sort_keys=True,
                          ensure_ascii=False)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return result
    finally:
        os.close(lock)


def _update(change: Any) -> Any:
    return update_record(trust_path(), "files", load, change)


def approve(root: str | os.PathLike[str], rel: str, sha256: str, kind: str) -> None:
    """Trust the content with digest ``sha256`` of ``rel`` in the folder ``root``."""
    key = key_of(root, rel)

    def change(held: dict[str, Any]) -> None:
        held[key] = {"sha256": sha256, "kind": kind,
                     "approved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    _update(change)
    with _lock:
        _decisions[key] = {"path": key, "kind": kind, "sha256": sha256, "decision": "trusted"}


def revoke(paths: list[str] | None = None, *, under: str | None = None) -> list[str]:
    """Forget the records of ``paths`` (absolute), or of every file under the folder
    ``under``; the paths forgotten."""

    def change(held: dict[str, Any]) -> list[str]:
        if under is not None:
            base = os.path.realpath(under)
            gone = sorted(k for k in held if k == base or k.startswith(base.rstrip("/") + "/"))
        else:
            gone = [p for p in paths or () if p in held]
        for name in gone:
            del held[name]
        return gone

    return list(_update(change))


def state(root: str | os.PathLike[str], rel: str, data: bytes) -> str:
    """``trusted``, ``changed`` (approved once, with other bytes) or ``new``."""
    held = load().get(key_of(root, rel))
    if held is None:
        return "new"
    return "trusted" if held.get("sha256") == digest(data) else "changed"


def decisions() -> list[dict[str, Any]]:
    """The trust decisions this process made, in force: one per file, in path order."""
    with _lock:
        return [dict(_decisions[k]) for k in sorted(_decisions)]


def gate(root: str | os.PathLike[str], rel: str, data: bytes, kind: str,
         summary: str = "") -> bool:
    """Whether ``data``, the bytes just read of ``rel`` in the project ``root``, may take
    effect. Asks on a terminal when they are not trusted; says one line otherwise. The same
    bytes declined once in this process are not asked about (nor said) again."""
    key = key_of(root, rel)
    sha = digest(data)
    st = state(root, rel, data)
    if st == "trusted":
        with _lock:
            _decisions[key] = {"path": key, "kind": kind, "sha256": sha, "decision": "trusted"}
        return True
    with _lock:
        declined = (key, sha) in _noted
    if not declined and _ask(key, kind, st, summary):
        approve(root, rel, sha, kind)
        return True
    with _lock:
        _decisions[key] = {"path": key, "kind": kind, "sha256": sha, "decision": "inert"}
        first = (key, sha) not in _noted
        _noted.add((key, sha))
    if first:
        import shlex

        from dsh.core.escape import escape_controls

        what = "changed since it was trusted" if st == "changed" else "not trusted"
        shown = escape_controls(shlex.quote(key), newlines=False)
        sys.stderr.write(f"dsh: {shown} ({KINDS.get(kind, kind)}) is {what}: not used; "
                         f"review it, then: dsh trust approve {shown}\n")
    return False


def _ask(key: str, kind: str, st: str, summary: str) -> bool:
    """The question on the terminal; ``False`` when there is none to ask on."""
    try:
        fd = os.open(TTY, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    import contextlib

    from dsh.core.escape import escape_controls

    def printable(text: str) -> str:
        return escape_controls(text, newlines=False)

    what = "changed since you trusted it" if st == "changed" else "is new to dsh"
    lines = [f"\ndsh: {printable(key)} {what}; it "
             f"{KINDS.get(kind, kind)}."]
    shown = summary.splitlines()
    for line in shown[:20]:
        lines.append("  " + printable(line))
    if len(shown) > 20:  # never a silent cut: what is not shown may be what matters
        lines.append(f"  … and {len(shown) - 20} more lines: review the file itself before "
                     "trusting it")
    lines.append("Trust this exact content? [y/N] ")
    # The command line's status line, when this process shows one, must not redraw over the
    # question (it is loaded only where there is a status line: nothing to import here).
    status = sys.modules.get("dsh.cli.status")
    paused = status.status_paused() if status is not None else contextlib.nullcontext()
    with paused, os.fdopen(fd, "r+b", buffering=0) as tty:
        tty.write("\n".join(lines).encode("utf-8", "replace"))
        try:
            answer = tty.readline(1024)
        except (OSError, KeyboardInterrupt):
            answer = b""
        if not answer.endswith(b"\n"):
            tty.write(b"\n")
    return answer.strip().lower() in (b"y", b"yes")


def reset() -> None:
    """Forget this process's decisions and notes (a new app, a test)."""
    with _lock:
        _decisions.clear()
        _noted.clear()
