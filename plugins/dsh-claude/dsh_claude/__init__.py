"""dsh-claude: a team's ``AGENTS.md``, ``CLAUDE.md`` and Agent Skills (``.claude/skills``)
work unchanged under dsh, recorded like everything else (docs/claude.md).

Installed, it is found through the ``dsh`` entry point ``claude`` and reaches the agents
that enable it (``plugins = ["claude"]``, or every agent that lists no plugins). Its
settings come from ``[plugins.claude]``, overlaid with
``[agents.NAME.plugin_settings.claude]`` (docs/config.md). This module is only the hook
implementations: the readers (:mod:`dsh_claude.frontmatter`, PyYAML) are imported when an
agent that enables the plugin runs a turn in a folder that has such files.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from dsh.hookspecs import hookimpl

if TYPE_CHECKING:
    from collections.abc import Callable

    from dsh_claude.settings import Settings
    from dsh_claude.skills import SkillRoot

__version__ = "0.1.0"
__all__ = ["__version__", "skill_roots"]

#: The key of this plugin's skill state in a projection's plugin-event index.
_SKILLS_INDEX = ("claude", "skills")


def skill_roots(settings: Settings, root: Path, cwd: Path, home: Path,
                raw: Any = None) -> list[SkillRoot]:
    """Where skills are discovered, in precedence order (the first of a name wins): the
    project's ``.claude/skills`` from the root down to the working directory, the folders of
    the ``skills`` setting, ``~/.claude/skills``, then the ``skills/`` of the enabled plugin
    folders (``raw``: the agent's ``[plugins.claude]`` table, its ``plugins`` list).

    Every folder inside the project is read beneath the project root with no symbolic link
    followed; the user's own folders outside it may be links, resolved once (``follow``)."""
    from dsh_claude.frontmatter import inside
    from dsh_claude.settings import expand
    from dsh_claude.skills import SkillRoot

    roots = []
    try:
        rel = cwd.relative_to(root)
        folders = [root] + [root.joinpath(*rel.parts[:i + 1]) for i in range(len(rel.parts))]
    except ValueError:
        folders = [root]
    for folder in folders:
        roots.append(SkillRoot(folder / ".claude" / "skills", "project", root))

    def own(folder: Path, source: str) -> SkillRoot:
        if inside(folder, [root]):
            return SkillRoot(folder, source, root)
        return SkillRoot(folder, source, follow=True)

    for path in settings.skills:
        folder = expand(path)
        roots.append(own(folder if folder.is_absolute() else cwd / folder, "settings"))
    if settings.user_skills:
        from dsh_claude.settings import claude_dir

        roots.append(own(claude_dir() / "skills", "user"))
    if raw and raw.get("plugins"):
        from dsh_claude.folders import plugin_skill_roots

        roots += plugin_skill_roots(raw)
    return roots


def _where(agent: Any) -> tuple[Settings, Path, Path, Path]:
    from dsh_claude.settings import for_agent
    from dsh_claude.settings import project_root

    settings = for_agent(agent)
    cwd = Path.cwd().resolve()
    return settings, project_root(settings, cwd), cwd, Path.home().resolve()


def _warn(problems: list[dict[str, Any]]) -> None:
    from dsh.core.errors import DshWarning
    from dsh.core.escape import escape_controls

    for p in problems:  # names from the project's files: no control byte reaches stderr
        line = escape_controls(f"{p['path']}: {p['problem']}", newlines=False)
        warnings.warn(f"dsh-claude: {line}", DshWarning, stacklevel=2)


@hookimpl
def register_tools(register: Callable[..., None], agent: Any) -> None:
    """``skill`` and ``skill_file``, when skills are enabled and some SKILL.md exists."""
    if _nothing_here(agent):
        return
    settings, root, cwd, home = _where(agent)
    if not settings.agent_skills:
        return
    from dsh_claude import skills

    roots = skill_roots(settings, root, cwd, home, agent.plugin_settings("claude"))
    if not any(skills._candidates(r) for r in roots):
        return

    def skill(name: str) -> str:
        """Load a skill: return its instructions (SKILL.md's body) and list its files.

        Call it when a task matches a skill's description in the Skills list, before you
        start the task. A skill with allowed-tools limits the tools you may use until the
        end of this turn.

        :param name: the skill's name, as in the Skills list.
        """
        return skills.load_skill(name)

    def skill_file(name: str, path: str) -> str:
        """Read one file of a skill's folder (a reference, template or script it mentions).

        :param name: the skill's name.
        :param path: the file's path relative to the skill's folder, e.g. "reference.md".
        """
        return skills.read_resource(name, path)

    register(skill)
    register(skill_file)


@hookimpl
def turn_prompt(register: Callable[..., None], agent: Any, session: Any) -> None:
    """The project instructions (order 50) and the skill catalogue (order 60), recorded
    when they change and rendered from the record."""
    if _nothing_here(agent) and not _recorded(session):
        return
    settings, root, cwd, home = _where(agent)
    if settings.any_instructions:
        from dsh_claude import instructions

        _warn(instructions.refresh(session, settings, root, cwd, home))
        text = instructions.render(session.state(instructions.INSTRUCTIONS))
        if text:
            register(text, order=instructions.ORDER, name="instructions")
    if settings.agent_skills:
        from dsh_claude import skills

        catalogue = skills.discover_skills(
            skill_roots(settings, root, cwd, home, agent.plugin_settings("claude")))
        _warn(skills.refresh(session, catalogue))
        text = skills.render(session.state(skills.SKILLS))
        if text:
            register(text, order=skills.ORDER, name="skills")


@hookimpl
def pre_execute(call: Any) -> None:
    """Refuse a tool the active skills' ``allowed-tools`` leave out (until the turn ends)."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None:
        return
    projection = ctx.ledger.projection
    index = projection.plugin_index
    if not index or _SKILLS_INDEX not in index:
        return  # no skill state in this session: nothing imported, nothing to check
    from dsh_claude.skills import SKILLS
    from dsh_claude.skills import refusal

    why = refusal(SKILLS.read(projection), projection.turn, call.call.name)
    if why:
        call.block(why)


# i24b: custom commands, sub-agent files, Claude Code plugin folders. Thin hooks: the modules
# doing the work (dsh_claude.commands / agents / folders / cli) are imported only when used.


def _project_folders(settings: Any) -> list[str]:
    """The project root (``root``, else the nearest ancestor of the working directory with
    ``.git``, else the working directory) down to the working directory, with ``os.path``
    only (no import): what the cheap checks below look in."""
    import os

    root = settings.get("root")
    if isinstance(root, str) and root:
        return [os.path.expanduser(root)]
    here = os.path.realpath(os.getcwd())
    folders = [here]
    while not os.path.exists(os.path.join(folders[-1], ".git")):
        up = os.path.dirname(folders[-1])
        if up == folders[-1]:
            return [here]
        folders.append(up)
    return folders[::-1]


def _user_claude_dir() -> str:
    import os

    return os.environ.get("CLAUDE_CONFIG_DIR") or os.path.expanduser("~/.claude")


def _agent_files_may_exist(settings: Any) -> bool:
    """Whether any folder of sub-agent files may exist (``os.path`` only, no import): the
    project's and the user's ``.claude/agents``, or an enabled plugin folder."""
    import os

    if settings.get("agents") is False or settings.get("enabled") is False:
        return False
    if settings.get("plugins"):
        return True
    folders = [os.path.join(f, ".claude", "agents") for f in _project_folders(settings)[:1]]
    folders.append(os.path.join(_user_claude_dir(), "agents"))
    return any(os.path.isdir(f) for f in folders)


#: Settings that name files elsewhere: with any of them the cheap check does not apply.
_NAMING = ("root", "skills", "plugins", "user_agents_md", "user_claude_md")


def _nothing_here(agent: Any) -> bool:
    """True when no file this plugin reads for a turn can exist (``os.path`` only, no import):
    no AGENTS.md, CLAUDE.md, CLAUDE.local.md or ``.claude`` from the project root down, none
    in the user's folders, and no setting naming other places. A run in a folder without
    them then imports nothing of the readers (start-up, issue 24)."""
    import os

    raw = agent.plugin_settings("claude")
    if any(raw.get(k) for k in _NAMING):
        return False
    names = ("AGENTS.md", "CLAUDE.md", "CLAUDE.local.md", ".claude")
    for folder in _project_folders(raw):
        if any(os.path.lexists(os.path.join(folder, n)) for n in names):
            return False
    user = _user_claude_dir()
    codex = os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex")
    return not any(os.path.lexists(p) for p in (
        os.path.join(user, "CLAUDE.md"), os.path.join(user, "skills"),
        os.path.join(codex, "AGENTS.md")))


def _recorded(session: Any) -> bool:
    """Whether the session holds any state of this plugin (it must then be kept in step)."""
    index = session.ledger.projection.plugin_index
    return bool(index) and any(k[0] == "claude" for k in index)


@hookimpl
def register_agents(register: Callable[..., None], app: Any) -> None:
    """Sub-agent files become agents (dsh_claude.agents)."""
    if _agent_files_may_exist(app.config.plugin_settings("claude")):
        from dsh_claude import agents

        agents.register_agents(register=register, app=app)


@hookimpl
def expand_command(name: str, arguments: str, agent: Any) -> Any:
    """``/NAME ARGS…`` from a command file (dsh_claude.commands)."""
    from dsh_claude import commands

    return commands.expand_command(name=name, arguments=arguments, agent=agent)


@hookimpl
def list_commands(agent: Any) -> dict[str, str] | None:
    from dsh_claude import commands

    return commands.list_commands(agent=agent)


@hookimpl
def register_commands(cli: Any) -> None:
    """``dsh claude`` (dsh_claude.cli)."""
    from dsh_claude import cli as claude_cli

    cli.add_command(claude_cli.claude)
