"""Project instructions: AGENTS.md and CLAUDE.md (with ``@path`` imports) as a system-prompt
fragment built from recorded state (docs/claude.md, "Project instructions").

At the start of each turn the files are read again (:func:`collect`); each file whose
SHA-256 differs from the one recorded is recorded (``x/claude/instructions`` ``{"op":
"file", path, sha256, text}``), then the list of files used, in order, when it differs
(``{"op": "use", "used": [...]}``). The fragment is rendered from that state only
(:func:`render`), so a resumed session, in any process, sends what the ledger holds; a file
changed since is recorded, and used, at the next turn's start.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsh.ledger.state import StateKey
from dsh_claude.frontmatter import ClaudeFileError
from dsh_claude.settings import PLUGIN
from dsh_claude.settings import Settings
from dsh_claude.settings import expand

#: The largest instruction file used, in bytes (its text must fit one plugin event).
MAX_INSTRUCTION = 48 * 1024
#: The most text of all instruction files together, in bytes; later files are skipped.
MAX_TOTAL = 192 * 1024
#: How many ``@import`` hops are followed from a file (Claude Code's bound).
MAX_IMPORT_DEPTH = 5
#: Where the fragment goes in the turn's system prompt (before dsh.memory's 200).
ORDER = 50
INITIAL: dict[str, Any] = {"files": {}, "used": []}


def reduce(state: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    op = data.get("op")
    files = dict(state["files"])
    used = state["used"]
    if op == "file":
        path, sha, text = data.get("path"), data.get("sha256"), data.get("text")
        if not (isinstance(path, str) and isinstance(sha, str) and isinstance(text, str)):
            raise ValueError("a file update has path, sha256 and text")
        files[path] = {"sha256": sha, "text": text}
    elif op == "use":
        used = data.get("used")
        if not isinstance(used, (list, tuple)):
            raise ValueError("a use update has a list 'used'")
        for entry in used:
            if "problem" not in entry:
                held = files.get(entry.get("path"))
                if held is None or held["sha256"] != entry.get("sha256"):
                    raise ValueError(f"{entry.get('path')!r} is used before it is recorded")
        keep = {e["path"] for e in used if "problem" not in e}
        files = {k: v for k, v in files.items() if k in keep}
    else:
        raise ValueError(f"unknown instructions operation {op!r} (file, use)")
    return {"files": files, "used": list(used)}


def summary(used: list[dict[str, Any]]) -> str:
    """The ``use`` event's line in ``dsh sessions show``: which files shape the turns."""
    if not used:
        return "instructions: no files"
    return "instructions: " + ", ".join(
        f"{e['path']} ({e['problem']})" if "problem" in e else
        f"{e['path']}{' via ' + e['via'] if e.get('via') else ''} sha256:{e['sha256'][:12]}"
        for e in used)


def show(state: Mapping[str, Any]) -> str:
    """What ``dsh sessions show`` prints: the files used, with their digests."""
    lines = []
    for entry in state["used"]:
        if "problem" in entry:
            lines.append(f"  - {entry['path']}: {entry['problem']} (not used)")
        else:
            via = f" (imported by {entry['via']})" if entry.get("via") else ""
            lines.append(f"  - {entry['path']}{via} sha256:{entry['sha256'][:12]}")
    return "instructions from:\n" + "\n".join(lines) if lines else "(no instruction files)"


INSTRUCTIONS: StateKey[dict[str, Any]] = StateKey(PLUGIN, "instructions", INITIAL, reduce,
                                                     max_bytes=1024 * 1024, show=show)


def render(state: Mapping[str, Any]) -> str:
    """The fragment the model sees ('' when no file is used)."""
    parts = []
    for entry in state["used"]:
        if "problem" in entry:
            continue
        text = state["files"][entry["path"]]["text"].strip()
        if not text:
            continue
        via = f" (imported by {entry['via']})" if entry.get("via") else ""
        parts.append(f"## {entry['path']}{via}\n\n{text}")
    if not parts:
        return ""
    return ("# Project instructions\n\nFrom the user's and the project's AGENTS.md and "
            "CLAUDE.md files, in order; a later file is nearer the working directory and "
            "takes precedence.\n\n" + "\n\n".join(parts))


def shown_path(path: Path, root: Path, home: Path) -> str:
    """``path`` for the prompt: relative to the project root, ``~/…`` under home, else as is."""
    for base, prefix in ((root, ""), (home, "~/")):
        try:
            rel = path.relative_to(base)
        except ValueError:
            continue
        return prefix + rel.as_posix() if prefix or rel.parts else "."
    return str(path)


_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE = re.compile(r"`[^`]*`")
_IMPORT = re.compile(r"(?<![\w@`/.])@((?:~/|/|\.{1,2}/)?[\w.\-~/]+)")


def imports_of(text: str) -> list[str]:
    """The ``@path`` references of a CLAUDE.md, outside code blocks and code spans, in order."""
    found: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for match in _IMPORT.finditer(_INLINE.sub("", line)):
            ref = match.group(1).rstrip(".,;:!?")
            if ref and ref not in found:
                found.append(ref)
    return found


class _Collector:
    """Reads the files in order. Each is read beneath a root folder (``root`` for the
    project's, the user's Claude or Codex folder for the user's) and its ``@imports`` stay
    beneath the same root: an import that leads out (``~/…``, ``/…``, ``..`` past the root)
    is recorded as a problem and not read — its target is not even looked at."""

    def __init__(self, root: Path, home: Path) -> None:
        self.root = root
        self.home = home
        self.entries: list[dict[str, Any]] = []
        self.seen: set[str] = set()
        self.total = 0
        self.texts: dict[str, str] = {}

    def add(self, path: Path, base: Path, *, via: str | None = None,
            chain: tuple[str, ...] = (), imports: bool = False,
            ref: str | None = None, follow: bool = False) -> None:
        """Read ``path`` beneath ``base``; ``ref``: the import as written (for messages);
        ``follow``: the person's own folder, where a file that is a link is resolved once."""
        from dsh_claude.frontmatter import decode
        from dsh_claude.frontmatter import locate
        from dsh_claude.frontmatter import read_beneath

        full = os.path.normpath(os.path.abspath(path))
        shown = shown_path(Path(full), self.root, self.home)
        found = locate(full, [base])
        if found is None:
            where = ("the project folder" if base == self.root else
                     shown_path(base, self.root, self.home))
            self.problem(ref if ref is not None else shown,
                         f"leads outside {where} (imports stay inside it): not read", via)
            return
        if full in chain:
            loop = " -> ".join(shown_path(Path(p), self.root, self.home)
                               for p in (*chain, full))
            self.problem(shown, f"an import loop ({loop}): not read again", via)
            return
        if full in self.seen:
            return
        if follow:
            real = os.path.realpath(full)
            found = (os.path.dirname(real), os.path.basename(real))
        try:
            data = read_beneath(found[0], found[1], MAX_INSTRUCTION, shown=shown)
            text = decode(data, shown)
        except ClaudeFileError as exc:
            if exc.problem == "does not exist":
                return  # no such file here; "@name" in prose that names no file
            self.problem(shown, exc.problem, via)
            return
        size = len(text.encode("utf-8"))
        if self.total + size > MAX_TOTAL:
            self.problem(shown, f"would bring the instructions over {MAX_TOTAL} bytes: not used",
                         via)
            return
        self.total += size
        self.seen.add(full)
        entry: dict[str, Any] = {"path": shown,
                                 "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
        if via:
            entry["via"] = via
        self.entries.append(entry)
        self.texts[shown] = text
        if not imports:
            return
        depth = len(chain) + 1
        for found_ref in imports_of(text):
            if depth > MAX_IMPORT_DEPTH:
                self.problem(found_ref, f"imported by {shown} past the import depth limit "
                                        f"({MAX_IMPORT_DEPTH}): not read", shown)
                continue
            target = expand(found_ref) if found_ref.startswith("~/") else (
                Path(found_ref) if found_ref.startswith("/") else Path(full).parent / found_ref)
            self.add(target, base, via=shown, chain=(*chain, full), imports=True,
                     ref=found_ref, follow=follow)

    def problem(self, shown: str, problem: str, via: str | None) -> None:
        entry = {"path": shown, "problem": problem}
        if via:
            entry["via"] = via
        if entry not in self.entries:
            self.entries.append(entry)


def user_root(path: Path) -> Path:
    """The folder a user-level instruction file is read beneath, and imports from: the user's
    Claude folder (``~/.claude``, ``$CLAUDE_CONFIG_DIR``) or Codex folder when the file is in
    one, else the file's own folder."""
    from dsh_claude.frontmatter import inside
    from dsh_claude.settings import claude_dir
    from dsh_claude.settings import codex_dir

    for folder in (claude_dir(), codex_dir()):
        if inside(path, [folder]):
            return Path(os.path.normpath(os.path.abspath(folder)))
    return Path(os.path.normpath(os.path.abspath(path))).parent


def collect(settings: Settings, root: Path, cwd: Path, home: Path) -> tuple[list[dict[str, Any]],
                                                                             dict[str, str]]:
    """The instruction files now, in order: the ``used`` entries and the texts by path."""
    c = _Collector(root, home)
    if not settings.any_instructions:
        return [], {}
    from dsh_claude.frontmatter import inside

    # The user's own files (outside the project) may be links, resolved once; never inside.
    if settings.agents_md and settings.user_agents_md:
        user = expand(settings.user_agents_md)
        base = user_root(user)
        c.add(user, base, follow=not inside(base, [root]))
    if settings.claude_md and settings.user_claude_md:
        user = expand(settings.user_claude_md)
        base = user_root(user)
        c.add(user, base, imports=True, follow=not inside(base, [root]))
    try:
        rel = cwd.relative_to(root)
        folders = [root] + [root.joinpath(*rel.parts[:i + 1]) for i in range(len(rel.parts))]
    except ValueError:
        folders = [root]
    for folder in folders:
        if settings.agents_md:
            c.add(folder / "AGENTS.md", root)
        if settings.claude_md:
            for name in ("CLAUDE.md", ".claude/CLAUDE.md", "CLAUDE.local.md"):
                c.add(folder / name, root, imports=True)
    return c.entries, c.texts


def refresh(session: Any, settings: Settings, root: Path, cwd: Path,
            home: Path) -> list[dict[str, Any]]:
    """Read the files now and record what changed; return the new problems (to warn about)."""
    used, texts = collect(settings, root, cwd, home)
    state = session.state(INSTRUCTIONS)
    for entry in used:
        if "problem" in entry:
            continue
        held = state["files"].get(entry["path"])
        if held is None or held["sha256"] != entry["sha256"]:
            session.update_state(INSTRUCTIONS, {
                "op": "file", "path": entry["path"], "sha256": entry["sha256"],
                "text": texts[entry["path"]],
                "summary": f"read {entry['path']} sha256:{entry['sha256'][:12]}"})
    if [dict(e) for e in state["used"]] == used:
        return []
    before = [dict(e) for e in state["used"] if "problem" in e]
    session.update_state(INSTRUCTIONS, {"op": "use", "used": used, "summary": summary(used)})
    return [e for e in used if "problem" in e and e not in before]
