"""Agent Skills: ``SKILL.md`` folders discovered, validated, offered to the model as a
catalogue, loaded on demand (docs/claude.md, "Agent Skills").

* :func:`discover_skills` reads the folders it is given (each a folder of skill folders,
  ``ROOT/NAME/SKILL.md``, or one skill folder, ``ROOT/SKILL.md``), validates each file's
  frontmatter (the Agent Skills specification, agentskills.io) and returns a
  :class:`Catalogue`: the skills in order and the problems (one line each, naming the file
  and key). A name already taken, by an earlier skill or a built-in, is a problem: the later
  skill is skipped.
* At each turn start the catalogue (names, descriptions, where the files are, their digests)
  is recorded when it changed (``x/claude/skills`` ``{"op": "catalogue"}``) and the prompt
  fragment is rendered from that record only.
* ``skill(name)`` returns the skill's body and records the load (``{"op": "load", "name",
  "turn"}``); ``skill_file(name, path)`` returns one of its files. A loaded skill with
  ``allowed-tools`` is *active* from its load to the end of that turn: other tools are
  refused (``pre_execute``).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dsh.ledger.state import StateKey
from dsh_claude.agents import TOOLS
from dsh_claude.frontmatter import ClaudeFileError
from dsh_claude.frontmatter import parse
from dsh_claude.frontmatter import read_text
from dsh_claude.settings import PLUGIN

MAX_NAME = 64
MAX_DESCRIPTION = 1024
MAX_COMPATIBILITY = 500
#: The most skills in a catalogue; later ones are skipped with a problem.
MAX_SKILLS = 200
#: The largest resource file ``skill_file`` returns, in bytes.
MAX_RESOURCE = 256 * 1024
#: How many resource files ``skill`` lists.
MAX_LISTED = 100
#: Where the catalogue goes in the turn's system prompt (after the instructions' 50).
ORDER = 60
NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
#: Names a skill may not take: dsh chat's built-in commands (a skill is a ``/name`` in
#: Claude Code) and the skill tools.
BUILTIN_NAMES = frozenset({"help", "tools", "model", "system", "session", "attach", "inject",
                           "stop", "exit", "quit", "skill", "skill-file"})
#: Claude Code's tool names in ``allowed-tools`` and the dsh tool each means: the table of
#: sub-agent files (:data:`dsh_claude.agents.TOOLS`).
TOOL_ALIASES = TOOLS
#: Tools never refused while a skill is active: the skill tools themselves.
ALWAYS_ALLOWED = ("skill", "skill_file")


@attrs.frozen
class SkillRoot:
    """A folder to discover skills in. ``confine``: the folder every read happens beneath,
    by descriptor, with no symbolic link followed below it (default: ``folder``); ``source``:
    where it comes from, for messages (``project``, ``user``, ``settings``, ``plugin NAME``).

    ``follow``: for the user's own folders (outside the project): each skill folder is
    resolved once, when the skills are discovered, and its real folder is then the one read
    beneath — so ``~/.claude/skills/NAME`` may be a link into a dotfiles checkout. Never for a
    project's folders: there a link is refused, wherever it leads."""

    folder: Path
    source: str = "settings"
    confine: Path | None = None
    follow: bool = False


@attrs.frozen
class Catalogue:
    """Discovered skills (JSON-ready dicts: ``name``, ``description``, ``path``, ``dir``,
    ``confine``, ``sha256``, ``allowed_tools`` (a list, or None: all), ``source``) and
    problems (``{"path", "problem"}``), in discovery order."""

    skills: tuple[dict[str, Any], ...] = ()
    problems: tuple[dict[str, Any], ...] = ()


def parse_allowed_tools(value: Any, path: str) -> list[str]:
    """``allowed-tools`` as dsh tool names: a space- or comma-separated string, or a list.
    ``Bash(git:*)`` means the tool ``Bash`` (its argument pattern is not enforced: see
    docs/claude.md); Claude Code's names are mapped through :data:`TOOL_ALIASES` (``Bash``
    → ``run_command``, ``Edit`` → ``edit_file``, …); other names are kept as dsh names."""
    if isinstance(value, list):
        items = []
        for item in value:
            if not isinstance(item, str):
                raise ClaudeFileError(path, "key 'allowed-tools': expected tool names, not a "
                                            "nested list or mapping")
            items.extend(re.findall(r"[^\s,()]+(?:\([^)]*\))?", item))
    elif isinstance(value, str):
        items = re.findall(r"[^\s,()]+(?:\([^)]*\))?", value)
    else:
        raise ClaudeFileError(path, "key 'allowed-tools': expected a list of tool names")
    out: list[str] = []
    for item in items:
        base = item.split("(", 1)[0]
        name = TOOL_ALIASES.get(base, base)
        if name not in out:
            out.append(name)
    return out


def validate(meta: Mapping[str, Any], folder_name: str, path: str) -> dict[str, Any]:
    """The checked frontmatter of a SKILL.md; :class:`ClaudeFileError` naming the key."""
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ClaudeFileError(path, "key 'name': missing (a skill needs a name)")
    if len(name) > MAX_NAME or not NAME.match(name):
        raise ClaudeFileError(path, f"key 'name': {name[:80]!r} is not 1-{MAX_NAME} lowercase "
                                    "letters, digits and single hyphens (not at either end)")
    if name != folder_name:
        raise ClaudeFileError(path, f"key 'name': {name!r} does not match its folder "
                                    f"{folder_name!r}")
    description = meta.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ClaudeFileError(path, "key 'description': missing or empty (a skill needs a "
                                    "description)")
    if len(description) > MAX_DESCRIPTION:
        raise ClaudeFileError(path, f"key 'description': {len(description)} characters; the "
                                    f"limit is {MAX_DESCRIPTION}")
    for key in ("license", "compatibility"):
        if key in meta and not isinstance(meta[key], str):
            raise ClaudeFileError(path, f"key {key!r}: expected text")
    if len(meta.get("compatibility", "")) > MAX_COMPATIBILITY:
        raise ClaudeFileError(path, f"key 'compatibility': more than {MAX_COMPATIBILITY} "
                                    "characters")
    if "metadata" in meta:
        md = meta["metadata"]
        if not isinstance(md, dict) or not all(isinstance(v, str) for v in md.values()):
            raise ClaudeFileError(path, "key 'metadata': expected a mapping of text to text")
    allowed = parse_allowed_tools(meta["allowed-tools"], path) \
        if "allowed-tools" in meta else None
    return {"name": name, "description": " ".join(description.split()),
            "allowed_tools": allowed}


def _candidates(root: SkillRoot) -> list[Path]:
    folder = root.folder
    try:
        if (folder / "SKILL.md").exists() or (folder / "SKILL.md").is_symlink():
            return [folder / "SKILL.md"]
        if not folder.is_dir():
            return []
        found = []
        for child in sorted(folder.iterdir(), key=lambda p: p.name):
            skill = child / "SKILL.md"
            if not child.name.startswith(".") and child.is_dir() and (
                    skill.exists() or skill.is_symlink()):
                found.append(skill)
        return found
    except OSError:
        return []


def _normal(path: Path) -> Path:
    """``path`` absolute, ``.`` and ``..`` folded by name (no link is resolved)."""
    return Path(os.path.normpath(os.path.abspath(path)))


def discover_skills(roots: Iterable[SkillRoot | Path]) -> Catalogue:
    """The skills under ``roots``, in order; the first of a name wins (a later one is a
    problem, as is a built-in name). Never raises for a bad file: it is a problem."""
    skills: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    taken: dict[str, str] = {}
    for root in roots:
        if isinstance(root, Path):
            root = SkillRoot(root)
        confine = root.confine or root.folder
        for path in _candidates(root):
            shown = str(path)
            if len(skills) >= MAX_SKILLS:
                problems.append({"path": shown, "problem": f"more than {MAX_SKILLS} skills: "
                                                           "skipped"})
                continue
            folder, base = _normal(path.parent), _normal(confine)
            if root.follow:  # the user's own folder: resolved once, here
                folder = base = Path(os.path.realpath(path.parent))
            try:
                text = read_text(folder / "SKILL.md", [base])
                doc = parse(text, path)
                checked = validate(doc.meta, path.parent.name, shown)
            except ClaudeFileError as exc:
                problems.append({"path": shown, "problem": exc.problem})
                continue
            name = checked["name"]
            if name in BUILTIN_NAMES:
                problems.append({"path": shown, "problem": f"key 'name': {name!r} is a built-in "
                                                           "name: skipped"})
                continue
            if name in taken:
                problems.append({"path": shown, "problem": f"key 'name': {name!r} is already the "
                                                           f"skill {taken[name]}: skipped"})
                continue
            taken[name] = shown
            text_sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
            skills.append({**checked, "path": shown, "dir": str(folder), "confine": str(base),
                           "sha256": text_sha, "source": root.source})
    return Catalogue(tuple(skills), tuple(problems))


# ------------------------------------------------------------------------ recorded state

INITIAL: dict[str, Any] = {"catalogue": [], "problems": [], "active": []}


def reduce(state: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    op = data.get("op")
    if op == "catalogue":
        skills, problems = data.get("skills"), data.get("problems", [])
        if not isinstance(skills, (list, tuple)) or not isinstance(problems, (list, tuple)):
            raise ValueError("a catalogue update has lists 'skills' and 'problems'")
        return {"catalogue": list(skills), "problems": list(problems),
                "active": list(state["active"])}
    if op == "load":
        name, turn = data.get("name"), data.get("turn")
        if not isinstance(turn, int):
            raise ValueError("a load update has an integer 'turn'")
        entry = next((s for s in state["catalogue"] if s["name"] == name), None)
        if entry is None:
            raise ValueError(f"no skill {name!r} in the catalogue")
        active = [a for a in state["active"] if a["turn"] >= turn]
        active.append({"name": name, "turn": turn, "allowed_tools": entry["allowed_tools"]})
        return {"catalogue": list(state["catalogue"]), "problems": list(state["problems"]),
                "active": active}
    raise ValueError(f"unknown skills operation {op!r} (catalogue, load)")


def show(state: Mapping[str, Any]) -> str:
    lines = [f"  - {s['name']}: {s['path']} sha256:{s['sha256'][:12]}"
             for s in state["catalogue"]]
    lines += [f"  - {p['path']}: {p['problem']} (not used)" for p in state["problems"]]
    loaded = [f"{a['name']} (turn {a['turn']})" for a in state["active"]]
    text = "skills:\n" + "\n".join(lines) if lines else "(no skills)"
    return text + (f"\nloaded: {', '.join(loaded)}" if loaded else "")


SKILLS: StateKey[dict[str, Any]] = StateKey(PLUGIN, "skills", INITIAL, reduce,
                                               max_bytes=1024 * 1024, show=show)


def render(state: Mapping[str, Any]) -> str:
    """The catalogue as the model sees it ('' when there is no skill)."""
    if not state["catalogue"]:
        return ""
    lines = [f"- {s['name']}: {s['description']}" for s in state["catalogue"]]
    return ("# Skills\n\nSkills hold instructions for particular tasks. When a task matches a "
            "skill's description, call skill(name) to read its instructions before you start, "
            "and skill_file(name, path) to read the files they mention.\n\n" + "\n".join(lines))


def refresh(session: Any, catalogue: Catalogue) -> list[dict[str, Any]]:
    """Record the catalogue when it changed; return its new problems (to warn about)."""
    state = session.state(SKILLS)
    skills, problems = [dict(s) for s in catalogue.skills], list(catalogue.problems)
    if _plain(state["catalogue"]) == skills and _plain(state["problems"]) == problems:
        return []
    before = _plain(state["problems"])
    line = "skills: " + (", ".join(f"{s['name']} ({s['path']} sha256:{s['sha256'][:12]})"
                                   for s in skills) or "none")
    if problems:
        line += f"; {len(problems)} skipped: " + ", ".join(p["path"] for p in problems)
    session.update_state(SKILLS, {"op": "catalogue", "skills": skills, "problems": problems,
                                  "summary": line})
    return [p for p in problems if p not in before]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# ------------------------------------------------------------------------ the tools


def _entry(state: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    from dsh.core.errors import ToolError

    for s in state["catalogue"]:
        if s["name"] == name:
            return s
    names = ", ".join(s["name"] for s in state["catalogue"]) or "none"
    raise ToolError(f"no skill named {name!r} (skills: {names})")


def _resources(confine: Path, folder: Path) -> list[str]:
    """The files of the skill ``folder`` (beneath ``confine``), relative to it: listed from
    the folder's descriptor; links, hidden names and ``SKILL.md`` left out."""
    from dsh.core import beneath
    from dsh_claude.frontmatter import locate

    found = locate(folder, [confine])
    if found is None:
        return []
    out: list[str] = []

    def walk(dfd: int, prefix: str) -> None:
        try:
            entries = sorted(os.scandir(dfd), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if len(out) > MAX_LISTED:
                return
            if e.name.startswith("."):
                continue
            rel = prefix + e.name
            if e.is_dir(follow_symlinks=False):
                try:
                    sub = beneath.open_dir(dfd, e.name)
                except OSError:
                    continue
                try:
                    walk(sub, rel + "/")
                finally:
                    os.close(sub)
            elif e.is_file(follow_symlinks=False) and rel != "SKILL.md":
                out.append(rel)

    try:
        top = beneath.open_dir(found[0], found[1])
    except OSError:
        return []
    try:
        walk(top, "")
    finally:
        os.close(top)
    out.sort()
    return out[:MAX_LISTED] + (["…"] if len(out) > MAX_LISTED else [])


def load_skill(name: str) -> str:
    """The body of skill ``name``, recording the load (the tool ``skill``)."""
    from dsh.core.errors import ToolError
    from dsh.host.runcontext import context

    ctx = context()
    state = SKILLS.read(ctx.ledger.projection)
    entry = _entry(state, name)
    folder, confine = Path(entry["dir"]), Path(entry["confine"])
    try:
        doc = parse(read_text(folder / "SKILL.md", [confine]), entry["path"])
    except ClaudeFileError as exc:
        raise ToolError(f"skill {name}: {exc}") from None
    SKILLS.update({"op": "load", "name": name, "turn": ctx.ledger.projection.turn,
                   "summary": f"loaded skill {name} ({entry['path']})"})
    files = _resources(confine, folder)
    head = [f"# Skill {name}", f"Folder: {folder}"]
    if files:
        head.append("Files (read with skill_file): " + ", ".join(files))
    if entry["allowed_tools"] is not None:
        head.append("While this skill is active (until the end of this turn) only these tools "
                    "may be used: " + ", ".join([*entry["allowed_tools"], *ALWAYS_ALLOWED]))
    return "\n".join(head) + "\n\n" + doc.body.strip()


def read_resource(name: str, path: str) -> str:
    """One file of skill ``name`` (the tool ``skill_file``): relative to the skill's folder,
    never outside it (no absolute path, no ``..``, no symlink out)."""
    from dsh.core.errors import ToolError
    from dsh.host.runcontext import context

    state = SKILLS.read(context().ledger.projection)
    entry = _entry(state, name)
    try:
        return read_inside(Path(entry["dir"]), path, Path(entry["confine"]))
    except ClaudeFileError as exc:
        raise ToolError(f"skill_file {name}: {exc}") from None


def read_inside(folder: Path, path: str, confine: Path | None = None) -> str:
    """The text of ``path`` relative to ``folder``, never outside it: an empty or absolute
    path or a ``..`` part is a :class:`ClaudeFileError`, and the file is read beneath
    ``confine`` (default: ``folder``) by descriptor, so a symbolic link anywhere on the way
    is refused, not followed — whatever a process swaps in between two calls."""
    rel = Path(path)
    if not path or "\0" in path or rel.is_absolute() or ".." in rel.parts:
        raise ClaudeFileError(repr(path), "must be a path inside the skill's folder, relative "
                                          "to it, without '..'")
    return read_text(folder / rel, [confine or folder], MAX_RESOURCE)


def refusal(state: Mapping[str, Any], turn: int, tool: str) -> str | None:
    """Why ``tool`` is refused in ``turn`` (the skills active then allow it not), or None."""
    active = [a for a in state["active"] if a["turn"] == turn
              and a["allowed_tools"] is not None]
    if not active or tool in ALWAYS_ALLOWED:
        return None
    allowed: list[str] = []
    for a in active:
        allowed.extend(t for t in a["allowed_tools"] if t not in allowed)
    if tool in allowed:
        return None
    names = ", ".join(sorted({a["name"] for a in active}))
    return (f"the active skill {names} allows only {', '.join(allowed) or 'no other tool'} "
            f"(allowed-tools) until the end of this turn; {tool} is not one of them")
