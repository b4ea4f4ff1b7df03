"""What git obeys in a workspace besides its top-level ``.git``: the targets of
``core.hooksPath`` and of ``include.path`` / ``includeIf.*.path`` in its config, and the git
directories of nested repositories (``.gitmodules``, and ``.git`` entries a bounded scan
finds). The sandbox binds them read-only like the persistence paths
(:func:`dsh.sandbox.policy.build_plan`); git itself is never run to find them (a planted
config could make it run anything), its config is parsed here.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any

from dsh.sandbox.policy import _kind_at
from dsh.sandbox.policy import _prefixes
from dsh.sandbox.policy import _within

#: The scan for nested repositories (:func:`git_paths`): how deep it looks (``a/b/c/.git``),
#: how many directory entries it reads at most, how many repositories it keeps at most, and
#: the folders it never enters (git's own, and big trees of packages and caches).
GIT_SCAN_DEPTH = 3
GIT_SCAN_ENTRIES = 4000
GIT_SCAN_REPOS = 64
GIT_SCAN_SKIP = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__", ".tox",
                           ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".cache",
                           "target", ".gradle", ".terraform", "site-packages"})
#: git's own bound on nested ``include.path``.
_INCLUDE_DEPTH = 10
_CONFIG_CAP = 1 << 20


def git_paths(root: str) -> tuple[list[str], str]:
    """What git obeys in ``root`` (resolved) outside its top-level ``.git``, as absolute
    paths to keep read-only: the targets of ``core.hooksPath``, ``include.path`` and
    ``includeIf.*.path`` of each repository's config (followed through the files they
    include), and the git directory of each nested repository — a ``.git`` found at most
    :data:`GIT_SCAN_DEPTH` folders down (:data:`GIT_SCAN_SKIP` never entered), or at a
    submodule's ``path`` in ``.gitmodules`` — with the directory its ``gitdir:`` line names
    when that lies in ``root``. Files are read beneath ``root`` (:mod:`dsh.core.beneath`) and
    parsed here; git itself is never run (a planted config could make it run anything).
    Paths outside ``root`` are left out. The second value says where the scan stopped early
    (:data:`GIT_SCAN_ENTRIES`, :data:`GIT_SCAN_REPOS`), or is empty."""
    out: list[str] = []
    seen: set[str] = set()

    def add(path: str) -> None:
        if path != root and _within(path, root) and path not in seen:
            seen.add(path)
            out.append(path)

    def keep(path: str) -> None:
        path = os.path.normpath(path)
        if not _within(path, root):  # the workspace named through a link: resolve it
            path = os.path.realpath(path)
            if not _within(path, root):
                return
        for prefix in _prefixes(os.path.relpath(path, root)):
            if os.path.islink(os.path.join(root, prefix)):
                add(os.path.join(root, prefix))  # the link itself, and where it leads
                add(os.path.realpath(path))
                return
        add(path)

    repos, note = _nested_repos(root)
    for worktree in ["", *repos]:
        if worktree:
            keep(os.path.join(root, worktree, ".git"))
        gitdir = _gitdir(root, worktree)
        if gitdir is None:
            continue
        if gitdir != posixpath.join(worktree, ".git"):
            keep(os.path.join(root, gitdir))
        for name in ("config", "config.worktree"):
            _config_targets(root, posixpath.join(gitdir, name), worktree, keep, set(), 0)
    return out, note


#: The last scan of each root: ``(scanned folders and their lstat, repositories, note)``.
_SCANS: dict[str, tuple[tuple[tuple[str, Any], ...], tuple[str, ...], str]] = {}


def _nested_repos(root: str) -> tuple[list[str], str]:
    """The worktrees (relative) of the repositories nested in ``root``: submodule paths of
    ``.gitmodules``, then folders holding a ``.git``, breadth first."""
    repos: list[str] = []
    for key, value in _read_config(root, ".gitmodules"):
        if key.startswith("submodule.") and key.endswith(".path"):
            rel = posixpath.normpath(value)
            if not rel.startswith(("/", "..")) and rel != "." and rel not in repos:
                repos.append(rel)
    found, note = _scan(root)
    repos += [rel for rel in found if rel not in repos]
    if len(repos) > GIT_SCAN_REPOS:
        note = note or (f"{len(repos)} nested git repositories: only the first "
                        f"{GIT_SCAN_REPOS} are kept read-only")
        repos = repos[:GIT_SCAN_REPOS]
    return repos, note


def _lstat(path: str) -> Any:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _scan(root: str) -> tuple[tuple[str, ...], str]:
    """The folders (relative) holding a ``.git``, breadth first, at most
    :data:`GIT_SCAN_DEPTH` down and :data:`GIT_SCAN_ENTRIES` entries read. The answer is
    kept while no folder it read has changed (same inode and change time — which, unlike
    the modification time, no program can set back); a folder changed in the last second
    is not trusted to show a later change (timestamps are coarse), so then it is not kept."""
    last = _SCANS.get(root)
    if last is not None and all(_lstat(os.path.join(root, rel)) == st for rel, st in last[0]):
        return last[1], last[2]
    import time

    racy = time.time_ns() - 1_000_000_000
    scanned: list[tuple[str, Any]] = []
    repos: list[str] = []
    budget, level, note = GIT_SCAN_ENTRIES, [""], ""
    for depth in range(GIT_SCAN_DEPTH + 1):
        deeper: list[str] = []
        for rel in level:
            scanned.append((rel, _lstat(os.path.join(root, rel))))
            try:
                with os.scandir(os.path.join(root, rel) if rel else root) as entries:
                    for entry in entries:
                        budget -= 1
                        if budget < 0:
                            break
                        if entry.name == ".git":
                            if rel:
                                repos.append(rel)
                        elif (depth < GIT_SCAN_DEPTH and entry.name not in GIT_SCAN_SKIP
                              and entry.is_dir(follow_symlinks=False)):
                            deeper.append(posixpath.join(rel, entry.name))
            except OSError:
                continue
            if budget < 0:
                note = (f"the scan for nested git repositories stopped after "
                        f"{GIT_SCAN_ENTRIES} entries (in {rel or '.'}): one further in may "
                        "stay writable")
                break
        if budget < 0:
            break
        level = deeper
    if all(st is not None and st[2] < racy for _, st in scanned):
        _SCANS[root] = (tuple(scanned), tuple(repos), note)
    else:
        _SCANS.pop(root, None)
    return tuple(repos), note


def _gitdir(root: str, worktree: str) -> str | None:
    """The git directory (relative) of the repository whose worktree is ``worktree``:
    ``.git`` itself, or where its ``gitdir:`` line points when that lies in ``root``."""
    from dsh.core import beneath

    dotgit = posixpath.join(worktree, ".git")
    kind = _kind_at(root, dotgit)
    if kind == "dir":
        return dotgit
    if kind != "file":
        return None
    try:
        text = beneath.read(root, dotgit, 4096).decode("utf-8", "surrogateescape")
    except (OSError, ValueError):
        return None
    if not text.startswith("gitdir:"):
        return None
    target = text[len("gitdir:"):].strip()
    path = os.path.normpath(os.path.join(root, worktree, target))
    if path == root or not _within(path, root):
        return None
    return os.path.relpath(path, root)


def _config_targets(root: str, rel: str, worktree: str, keep: Any, done: set[str],
                    depth: int) -> None:
    """Pass to ``keep`` the absolute targets of ``core.hooksPath`` (relative to
    ``worktree``) and of ``include.path`` / ``includeIf.*.path`` (relative to the including
    file) in the config ``rel``, and those of the files it includes that lie in ``root``."""
    if rel in done or depth > _INCLUDE_DEPTH:
        return
    done.add(rel)
    for key, value in _read_config(root, rel):
        if key == "core.hookspath":
            base = os.path.join(root, worktree)
        elif key == "include.path" or (key.startswith("includeif.") and key.endswith(".path")):
            base = os.path.join(root, posixpath.dirname(rel))
        else:
            continue
        if value.startswith("~/") or value == "~":
            value = os.path.expanduser(value)
        elif value.startswith(("~", "%(prefix)")):
            continue
        path = os.path.normpath(os.path.join(base, value))
        keep(path)
        if key == "core.hookspath" and os.path.basename(path) == "_":
            keep(os.path.dirname(path))  # husky: .husky/_/pre-commit runs .husky/pre-commit
        if key != "core.hookspath" and path != root and _within(path, root):
            _config_targets(root, os.path.relpath(path, root), worktree, keep, done,
                            depth + 1)


def _read_config(root: str, rel: str) -> list[tuple[str, str]]:
    from dsh.core import beneath

    try:
        data = beneath.read(root, rel, _CONFIG_CAP)
    except (OSError, ValueError):
        return []
    return parse_git_config(data.decode("utf-8", "surrogateescape"))


_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_ESCAPES = {"n": "\n", "t": "\t", "b": "\b", '"': '"', "\\": "\\"}


def parse_git_config(text: str) -> list[tuple[str, str]]:
    """``(name, value)`` of each variable of a git config file, in order, as git reads it:
    ``name`` is ``section.key`` or ``section.subsection.key`` (section and key lower case),
    a variable without ``=`` is ``true``; quotes, escapes, line continuations and comments
    are undone. Parsing stops at the first malformed line (git refuses such a file)."""
    out: list[tuple[str, str]] = []
    text = text.replace("\r\n", "\n")
    i, n, section = 0, len(text), ""
    while i < n:
        c = text[i]
        if c in " \t\n":
            i += 1
        elif c in "#;":
            i = _eol(text, i)
        elif c == "[":
            i += 1
            start = i
            while i < n and (text[i] in _KEY_CHARS or text[i] == "."):
                i += 1
            name = text[start:i].lower()
            if i < n and text[i] == "]":
                section, i = name, i + 1
                continue
            while i < n and text[i] in " \t":
                i += 1
            if not name or "." in name or i >= n or text[i] != '"':
                return out
            i += 1
            sub: list[str] = []
            while i < n and text[i] not in '"\n':
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                sub.append(text[i])
                i += 1
            if text[i:i + 2] != '"]':
                return out
            section, i = f"{name}.{''.join(sub)}", i + 2
        elif c.isalpha() and section:
            start = i
            while i < n and text[i] in _KEY_CHARS:
                i += 1
            key = text[start:i].lower()
            while i < n and text[i] in " \t":
                i += 1
            if i >= n or text[i] in "\n#;":
                out.append((f"{section}.{key}", "true"))
                continue
            if text[i] != "=":
                return out
            value, i = _value(text, i + 1)
            if value is None:
                return out
            out.append((f"{section}.{key}", value))
        else:
            return out
    return out


def _eol(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _value(text: str, i: int) -> tuple[str | None, int]:
    """A value from ``i`` to its end of line: (the value or None if malformed, the index)."""
    out: list[str] = []
    spaces, quoted, n = "", False, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            break
        if not quoted and c in "#;":
            return "".join(out), _eol(text, i)
        if c in " \t" and not quoted:
            if out:
                spaces += c
            i += 1
            continue
        if c == "\\":
            nxt = text[i + 1:i + 2]
            if nxt == "\n":
                i += 2
                continue
            if nxt not in _ESCAPES:
                return None, i
            c, i = _ESCAPES[nxt], i + 1
        elif c == '"':
            quoted = not quoted
            i += 1
            continue
        out.append(spaces + c)
        spaces = ""
        i += 1
    if quoted:
        return None, i
    return "".join(out), i


