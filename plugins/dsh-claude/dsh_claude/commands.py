"""Custom commands: ``.claude/commands/*.md`` (project), ``~/.claude/commands/*.md`` (user)
and the ``commands/`` of enabled Claude Code plugin folders, run as ``dsh run /NAME ARGS…``
and ``/NAME`` in ``dsh chat`` (docs/claude.md, "Custom commands").

Names: ``review.md`` is ``/review``; ``frontend/component.md`` is ``/frontend:component``
(also ``/component`` when no other command has that name); a plugin folder's are
``/PLUGIN:NAME`` (also ``/NAME`` when unique). The project's shadow the user's, which
shadow plugin folders'.

Expansion (so what the user types can never trigger file reads or shell):

1. the file is read (bounded, beneath its folder, no link followed) and its frontmatter
   parsed — before any argument is seen, so ``---`` in the arguments is plain text;
2. the body is expanded in **one pass** (what a replacement inserts is never scanned again):
   ``!`CMD``` runs ``CMD`` under the agent's sandbox policy (``sh -c``, in the project
   folder, the arguments in ``$ARGUMENTS`` and ``$1…`` as *shell variables*, never pasted
   into the command text) and its output replaces it — refused unless the command's
   ``allowed-tools`` names ``Bash`` (as in Claude Code; or ``run_command``, its dsh name,
   :data:`dsh_claude.agents.TOOLS`) and ``[plugins.claude]
   command_shell`` is not false; and a command file **in the project** runs its shell lines
   only while its bytes are the ones the person trusted (``dsh trust``, kind ``command``):
   otherwise the ``!`…``` parts stay as they are, as text, with a note. ``@PATH`` (at the
   start or after a blank) becomes the file's content (bounded, read beneath the project
   root: a ``..`` past it, an absolute path or ``~`` outside it, and any link, are refused);
   ``$ARGUMENTS`` and ``$1`` … ``$9`` become the arguments.

The result is the prompt: sent and recorded as the user message (the ledger holds it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

#: The output of one ``!`…``` kept (bytes), and how long it may run (seconds).
MAX_SHELL_OUTPUT = 64 * 1024
SHELL_TIMEOUT = 30.0
#: The largest ``@file`` included (bytes).
MAX_AT_FILE = 256 * 1024
_SHELL = re.compile(r"!`([^`\n]+)`")
_ARGS = re.compile(r"\$ARGUMENTS|\$([1-9])")
_ALL = re.compile(r"!`(?P<shell>[^`\n]+)`|(?<!\S)@(?P<at>[A-Za-z0-9_./~-][^\s`'\"<>|;]*)"
                  r"|\$ARGUMENTS|\$(?P<n>[1-9])")


@attrs.frozen
class Command:
    """One command file: ``name`` (``ns:name``), ``path``, where it comes from (``project``,
    ``user``, ``plugin NAME``) and the folder it may read within (``root``)."""

    name: str
    path: Path
    origin: str
    root: Path
    alias: str | None = None
    #: The person's own folder: a file that is a link is resolved once (never a project's).
    follow: bool = False


def discover(settings: Mapping[str, Any]) -> tuple[dict[str, Command], list[str]]:
    """Every command by name (aliases included), and notes (shadowed names, bad plugin
    folders). Reads directories only, no file."""
    from dsh_claude.folders import configured_plugins
    from dsh_claude.folders import markdown_files
    from dsh_claude.folders import project_root
    from dsh_claude.folders import user_dir
    from dsh_claude.frontmatter import inside

    project = project_root(settings)
    plugins, notes = configured_plugins(settings)
    user = user_dir()
    sources: list[tuple[str, Path, Path, str]] = [  # (origin, folder, root, name prefix)
        ("project", project / ".claude" / "commands", project, ""),
        ("user", user / "commands", user, ""),
    ]
    sources += [(f"plugin {p.name}", folder, p.base, p.name)
                for p in plugins for folder in p.commands]
    table: dict[str, Command] = {}
    short: dict[str, list[Command]] = {}
    for origin, folder, root, prefix in sources:
        for ns, path in markdown_files(folder, root):
            base = path.name[:-3]
            name = ":".join(x for x in (prefix, ns, base) if x)
            if name in table:
                notes.append(f"command /{name} of {origin} ({path}) is shadowed by "
                             f"{table[name].origin} ({table[name].path})")
                continue
            table[name] = Command(name, path, origin, root,
                                  follow=origin == "user" and not inside(root, [project]))
            if name != base:
                short.setdefault(base, []).append(table[name])
    for base, cmds in short.items():
        if base not in table and len(cmds) == 1:
            table[base] = attrs.evolve(cmds[0], alias=cmds[0].name)
    return table, notes


def describe(cmd: Command) -> tuple[str, str]:
    """``(description, argument-hint)`` of a command (a bad file: its error as description)."""
    from dsh_claude.frontmatter import ClaudeFileError
    from dsh_claude.frontmatter import load

    try:
        doc = load(cmd.path, [cmd.root], follow=cmd.follow)
    except ClaudeFileError as exc:
        return f"(unusable: {exc.problem})", ""
    desc = doc.meta.get("description")
    if not isinstance(desc, str):
        desc = next((line.strip() for line in doc.body.splitlines() if line.strip()), "")
    hint = doc.meta.get("argument-hint", "")
    return desc[:200], hint if isinstance(hint, str) else " ".join(map(str, hint))


def _string_list(value: Any, key: str, path: Path) -> list[str]:
    from dsh_claude.frontmatter import ClaudeFileError

    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in re.split(r",(?![^(]*\))", value) if v.strip()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value if v.strip()]
    raise ClaudeFileError(path, f"key {key!r}: expected a comma-separated list or a list of "
                                "strings")


def split_arguments(arguments: str) -> list[str]:
    """``$1`` … ``$9``: the arguments split as a shell would (quotes group), or on blanks
    when the quoting is unbalanced."""
    import shlex

    try:
        return shlex.split(arguments)
    except ValueError:
        return arguments.split()


def run_shell(command: str, cmd: Command, arguments: str, agent: Any, project: Path) -> str:
    """The output of ``!`command``` run under the agent's sandbox (its text, or a line
    saying why it did not run — also recorded, so the model sees it)."""
    import os
    import subprocess

    from dsh import sandbox
    from dsh.core.errors import ConfigError

    policy = sandbox.policy_for(agent)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL",
                                                          "TERM", "USER", "LOGNAME")}
    env["ARGUMENTS"] = arguments
    argv = ["/bin/sh", "-c", command, f"/{cmd.name}", *split_arguments(arguments)[:9]]
    try:
        proc = sandbox.Popen(argv, policy, workspace=str(project), env=env,
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    except (sandbox.SandboxUnavailable, ConfigError, OSError) as exc:
        from dsh.core.errors import UsageError

        raise UsageError(f"{cmd.path}: !`{command}` not run: {exc}") from None
    try:
        out, _ = proc.communicate(timeout=SHELL_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"[!`{command}` stopped after {SHELL_TIMEOUT:g}s]"
    text = out[:MAX_SHELL_OUTPUT].decode("utf-8", "replace").rstrip("\n")
    if len(out) > MAX_SHELL_OUTPUT:
        text += f"\n[output cut at {MAX_SHELL_OUTPUT} bytes]"
    if proc.returncode:
        text += f"\n[exit status {proc.returncode}]"
    return text


def _include(m: re.Match[str], cmd: Command, project: Path) -> str:
    """``@PATH``: the file's content, read beneath the project root. A reference that leads
    out of the project (``..`` past the root, an absolute path or ``~`` elsewhere) or through
    a link is refused, without looking at its target; a name that is no file here (an e-mail
    handle, a decorator, a folder) stays as it is."""
    import os

    from dsh_claude.frontmatter import ClaudeFileError
    from dsh_claude.frontmatter import decode
    from dsh_claude.frontmatter import locate
    from dsh_claude.frontmatter import read_beneath

    ref = m.group("at").rstrip(".,:)")
    target = os.path.expanduser(ref) if ref.startswith("~") else os.path.join(project, ref)
    found = locate(target, [project])
    if found is None:
        raise ClaudeFileError(cmd.path, f"@{ref}: leads outside the project folder {project}: "
                                        "not read")
    try:
        data = read_beneath(found[0], found[1], MAX_AT_FILE, shown=ref)
    except ClaudeFileError as exc:
        if exc.problem == "does not exist" or exc.problem.startswith("is a directory"):
            return m.group(0)  # not a file reference (an e-mail handle, a decorator, …)
        raise ClaudeFileError(cmd.path, f"@{ref}: {exc.problem}") from None
    try:
        text = decode(data, ref)
    except ClaudeFileError as exc:
        raise ClaudeFileError(cmd.path, f"@{ref}: {exc.problem}") from None
    return f'<file path="{ref}">\n{text.rstrip()}\n</file>' + m.group("at")[len(ref):]


def shell_summary(cmd: Command, body: str) -> str:
    """What trusting a command file lets run: its ``!`…``` lines."""
    lines = [f"/{cmd.name} runs, each time it is used:"]
    lines += [f"  !`{c}`" for c in _SHELL.findall(body)[:15]]
    return "\n".join(lines)


def may_run_shell(cmd: Command, data: bytes, body: str, project: Path) -> bool:
    """Whether the ``!`…``` lines of ``cmd`` (its bytes ``data``) may run: always for the
    user's own and for plugin folders outside the project; for a file in the project only
    while those bytes are trusted (asked on a terminal; one line otherwise)."""
    import os

    from dsh_claude.frontmatter import gate
    from dsh_claude.frontmatter import in_project

    if not in_project(cmd.path, project):
        return True
    base = os.path.normpath(os.path.abspath(project))
    rel = os.path.relpath(os.path.normpath(os.path.abspath(cmd.path)), base)
    return gate(base, rel, data, "command", shell_summary(cmd, body))


def expand(cmd: Command, arguments: str, agent: Any, settings: Mapping[str, Any]) -> Any:
    """The :class:`dsh.run.commands.CommandExpansion` of ``/cmd arguments``."""
    from dsh.run.commands import CommandExpansion
    from dsh_claude.agents import map_model
    from dsh_claude.folders import project_root
    from dsh_claude.frontmatter import ClaudeFileError
    from dsh_claude.frontmatter import load_bytes

    data, doc = load_bytes(cmd.path, [cmd.root], follow=cmd.follow)  # before any argument
    allowed = _string_list(doc.meta.get("allowed-tools"), "allowed-tools", cmd.path)
    model = doc.meta.get("model")
    if model is not None and not isinstance(model, str):
        raise ClaudeFileError(cmd.path, "key 'model': expected a model name")
    project = project_root(settings)
    body = doc.body
    shell = True
    if _SHELL.search(body):
        if settings.get("command_shell") is False:
            raise ClaudeFileError(cmd.path, "runs shell lines (!`…`) and [plugins.claude] "
                                            "command_shell = false: not run")
        if not any(a.split("(", 1)[0].strip() in ("Bash", "run_command") for a in allowed):
            raise ClaudeFileError(cmd.path, "runs shell lines (!`…`) but its allowed-tools "
                                            "does not name Bash (as Claude Code requires; "
                                            "or dsh's run_command): not run")
        shell = may_run_shell(cmd, data, body, project)
        if not shell:
            import sys

            from dsh.core.escape import escape_controls

            sys.stderr.write(escape_controls(
                f"dsh: note: /{cmd.name}: the !`…` lines of {cmd.path} were not run (the "
                "file is not trusted); they are sent as text\n"))
    parts = split_arguments(arguments)

    def one(m: re.Match[str]) -> str:
        if m.group("shell") is not None:
            if not shell:
                return m.group(0)
            return run_shell(m.group("shell"), cmd, arguments, agent, project)
        if m.group("at") is not None:
            return _include(m, cmd, project)
        if m.group("n") is None:
            return arguments
        i = int(m.group("n")) - 1
        return parts[i] if i < len(parts) else ""

    # One pass over the file's body: what a replacement inserts (an argument, a file's
    # content, a command's output) is never scanned again, so it cannot expand anything.
    prompt = _ALL.sub(one, body).strip("\n")
    if arguments and not _ARGS.search(body):
        prompt = f"{prompt}\n\n{arguments}"  # as Claude Code: unused arguments are appended
    return CommandExpansion(prompt=prompt, model=map_model(model, settings) if model else None,
                            source=str(cmd.path))


def check_settings(settings: Mapping[str, Any], where: str) -> None:
    """i24b's keys of ``[plugins.claude]`` have their types (a ConfigError names the key)."""
    from dsh.core.errors import ConfigError

    for key in ("commands", "command_shell", "agents"):
        if key in settings and not isinstance(settings[key], bool):
            raise ConfigError(f"{where}: key {key!r}: expected true or false, not "
                              f"{settings[key]!r}")
    for key in ("models", "tools"):
        value = settings.get(key)
        if value is not None and not (isinstance(value, Mapping) and all(
                isinstance(v, str) for v in value.values())):
            raise ConfigError(f"{where}: key {key!r}: expected a table of strings, such as "
                              f"{{sonnet = \"openai:gpt-4o\"}}, not {value!r}")


def expand_command(name: str, arguments: str, agent: Any) -> Any:
    settings = agent.plugin_settings("claude")
    check_settings(settings, f"plugins.claude, agent {agent.name}")
    if settings.get("commands") is False or settings.get("enabled") is False:
        return None
    table, _ = discover(settings)
    cmd = table.get(name)
    if cmd is None:
        return None
    return expand(cmd, arguments, agent, settings)


def list_commands(agent: Any) -> dict[str, str] | None:
    settings = agent.plugin_settings("claude")
    if settings.get("commands") is False or settings.get("enabled") is False:
        return None
    from dsh.core.escape import escape_controls

    table, _ = discover(settings)
    # Names and descriptions come from the files: metadata, shown with no control byte.
    return {escape_controls(name, newlines=False): escape_controls(describe(cmd)[0],
                                                                   newlines=False)
            for name, cmd in table.items()}
