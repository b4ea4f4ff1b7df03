"""``[plugins.hooks]``: dsh's own hooks table and the Claude Code settings files it opts into.

The ``hooks`` object has Claude Code's structure, whichever file it comes from::

    {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "...",
                                                  "timeout": 60}]}]}

A malformed table is a :class:`dsh.core.errors.ConfigError` naming the file and the key: a guard
that silently does not load is worse than a run that does not start. Events dsh does not map
(``Notification``, …) and hook types other than ``command`` are kept aside, listed by
``dsh hooks list`` and never run.

The project's files (``.claude/settings.json``, ``.claude/settings.local.json``, a plugin
folder inside the project) may have been written by a confined command, a model or a
``git pull``: they are read through :mod:`dsh.core.beneath` (no symbolic link followed, dsh's
protected paths refused) and their hooks run only while the person trusts those exact bytes
(:func:`dsh.config.trust.gate`, :func:`admit`); a file not trusted, or changed since, is
inert. Their hooks are :attr:`Hook.from_project`: they may deny or ask, never approve.
Trust covers the file's bytes, not the scripts its commands run (``sh scripts/fmt.sh``), which
anything in the workspace may have rewritten: so their processes run under the kernel sandbox,
``workspace-write`` (no network) with the project as the workspace, unless the person's
``sandbox`` table names their source (:data:`PROJECT_SANDBOX`, :func:`policy_of`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import attrs

from dsh.core.errors import ConfigError

#: The protocol's events that dsh maps onto its hooks (docs/hooks-plugin.md has the table).
EVENTS = ("PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop", "SubagentStop",
          "PreCompact", "SessionStart", "SessionEnd")
#: Events whose ``matcher`` is used (on the tool name, the compaction trigger, the source).
MATCHED = frozenset({"PreToolUse", "PostToolUse", "PreCompact", "SessionStart"})
SOURCES = {"project": ".claude/settings.json", "local": ".claude/settings.local.json",
           "user": "~/.claude/settings.json"}
#: The settings files that lie in the project: read beneath it, used only once trusted.
PROJECT_SOURCES = frozenset({"project", "local"})
KEYS = ("hooks", "claude_settings", "claude_plugins", "project_dir", "tools", "env_keep",
        "max_output", "timeout", "sandbox")
#: The hook sources a ``sandbox`` table names: ``config`` (dsh's own TOML) and each settings
#: file. The person's own sources are unconfined unless their policy is set (their hooks were
#: written by the person); the project's are confined unless it is (:data:`PROJECT_SANDBOX`).
SANDBOX_SOURCES = ("config", *SOURCES, "claude_plugins")
#: The policy of a project-sourced hook (``project``, ``local``, a plugin folder inside the
#: project) whose source the ``sandbox`` table does not name: the project is its workspace.
PROJECT_SANDBOX = "workspace-write"
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_OUTPUT = 1024 * 1024
#: The most bytes of a Claude Code settings file read (it is read whole, then parsed).
SETTINGS_CAP = 4 * 1024 * 1024


@attrs.frozen
class Alias:
    """How a dsh tool is shown to hooks: its protocol ``name``, ``arguments`` renamed
    (dsh name → protocol name), and which of them are ``paths`` (shown absolute)."""

    name: str
    arguments: Mapping[str, str] = attrs.field(factory=dict, hash=False)
    paths: tuple[str, ...] = ()


#: dsh-shell's tools under Claude Code's names and input shapes.
DEFAULT_TOOLS: dict[str, Alias] = {
    "run_command": Alias("Bash", {"command": "command"}),
    "read_file": Alias("Read", {"path": "file_path", "start_line": "offset"}, ("file_path",)),
    "write_file": Alias("Write", {"path": "file_path", "content": "content"}, ("file_path",)),
}


@attrs.frozen
class Hook:
    """One configured command hook."""

    event: str
    matcher: str
    command: str
    timeout: float
    #: Where it was configured: a file path, or the TOML table.
    source: str
    #: Why it never runs (an event or hook type dsh does not support), else "".
    ignored: str = ""
    #: The kernel sandbox of its process (:class:`dsh.sandbox.Policy`), None: unconfined.
    policy: Any = None
    #: The Claude Code plugin folder it comes from (``CLAUDE_PLUGIN_ROOT``), else "".
    plugin_root: str = ""
    #: From a file in the project (trusted by content): its PreToolUse ``allow`` approves
    #: nothing (dsh's approval rules still apply); ``deny`` and ``ask`` work.
    from_project: bool = False


@attrs.frozen
class HookSettings:
    hooks: tuple[Hook, ...]
    project_dir: str
    tools: Mapping[str, Alias] = attrs.field(hash=False)
    env_keep: tuple[str, ...] = ()
    max_output: int = DEFAULT_MAX_OUTPUT
    #: Settings files looked for and not found (shown by ``dsh hooks list``).
    missing: tuple[str, ...] = ()

    def active(self, event: str) -> list[Hook]:
        return [h for h in self.hooks if h.event == event and not h.ignored]

    @property
    def empty(self) -> bool:
        return not any(not h.ignored for h in self.hooks)


def check(raw: Mapping[str, Any], where: str) -> None:
    """Validate the TOML table without I/O (at assembly, MISSION D1)."""
    for key in raw:
        if key not in KEYS:
            raise ConfigError(f"[{where}]: unknown key {key!r}; valid keys: {', '.join(KEYS)}")
    sources = raw.get("claude_settings", [])
    if not isinstance(sources, list) or any(s not in SOURCES for s in sources):
        raise ConfigError(f"[{where}] claude_settings: expected a list of "
                          f"{', '.join(map(repr, SOURCES))}, got {sources!r}")
    for key in ("project_dir",):
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            raise ConfigError(f"[{where}] {key}: expected a non-empty string, got {raw[key]!r}")
    keep = raw.get("env_keep", [])
    if not isinstance(keep, list) or not all(isinstance(k, str) and k for k in keep):
        raise ConfigError(f"[{where}] env_keep: expected a list of variable names, got {keep!r}")
    for key in ("max_output", "timeout"):
        if key in raw:
            v = raw[key]
            if not _positive(v):
                raise ConfigError(f"[{where}] {key}: expected a positive finite number, "
                                  f"got {v!r}")
    _tools(raw.get("tools", {}), where)
    if "claude_plugins" in raw:
        from dsh_hooks import plugin_folders

        plugin_folders.check(raw["claude_plugins"], where)
    policies(raw, where)
    parse_hooks(raw.get("hooks", {}), f"[{where}] hooks", strict=True,
                default_timeout=float(raw.get("timeout", DEFAULT_TIMEOUT)))


def load(raw: Mapping[str, Any], where: str, workspace: str | None, *,
         review: bool = False) -> HookSettings:
    """The hooks of one agent: the TOML table, then each opted-in settings file (I/O).

    A project file's hooks are kept only when :func:`admit` lets them (it asks on a terminal,
    else says one line on stderr); ``review`` (``dsh hooks list``) asks nothing and keeps them,
    marked ignored with why."""
    check(raw, where)
    project = os.path.realpath(os.path.expanduser(
        raw.get("project_dir") or workspace or os.getcwd()))
    timeout = float(raw.get("timeout", DEFAULT_TIMEOUT))
    confine = policies(raw, where)
    hooks = [attrs.evolve(h, policy=policy_of(confine, "config", False, where))
             for h in parse_hooks(raw.get("hooks", {}), f"[{where}] hooks", strict=True,
                                  default_timeout=timeout)]
    missing = []
    for name in raw.get("claude_settings", []):
        rel = SOURCES[name]
        ours = name in PROJECT_SOURCES
        path = os.path.join(project, rel) if ours else os.path.expanduser(rel)
        data = read_settings(path, project if ours else None, rel)
        if data is None:
            missing.append(path)
            continue
        try:
            found, problem = settings_hooks(data, path, timeout), None
        except ConfigError as exc:
            found, problem = [], exc
        why = ""
        if ours:
            found = [attrs.evolve(h, from_project=True) for h in found]
            why = admit(project, rel, data, "hooks", found, problem, review=review)
            if why and not review:
                continue  # inert: the gate said so (one line on stderr)
        if problem is not None:
            raise problem
        hooks.extend(attrs.evolve(h, policy=policy_of(confine, name, ours, where),
                                  ignored=h.ignored or why) for h in found)
    if raw.get("claude_plugins"):
        from dsh_hooks import plugin_folders

        hooks.extend(attrs.evolve(h, policy=policy_of(confine, "claude_plugins",
                                                      h.from_project, where))
                     for h in plugin_folders.load(
                         raw["claude_plugins"], where, project, timeout, review=review,
                         workspace=os.path.expanduser(workspace) if workspace else None))
    tools = dict(DEFAULT_TOOLS)
    tools.update(_tools(raw.get("tools", {}), where))
    return HookSettings(tuple(hooks), project, tools, tuple(raw.get("env_keep", [])),
                        int(raw.get("max_output", DEFAULT_MAX_OUTPUT)), tuple(missing))


def read_settings(path: str, root: str | None, rel: str) -> bytes | None:
    """The bytes of a hook settings file (None when it does not exist): ``rel`` beneath the
    project ``root`` (:func:`dsh.core.beneath.read`: no symbolic link followed, dsh's protected
    paths refused), or the user's own file ``path`` by name (``root`` None). Bounded; a FIFO
    or a device is refused instead of blocking the run. Other problems: a ConfigError."""
    from dsh.core import beneath
    from dsh.core import files

    try:
        if root is None:
            return files.read_regular(path, SETTINGS_CAP)
        return beneath.read(root, rel, SETTINGS_CAP)
    except FileNotFoundError:
        return None
    except beneath.Refused as exc:
        raise ConfigError(f"{path}: cannot read hook settings: {exc.why}; its hooks would "
                          "not run (replace a link with the file itself)") from None
    except files.NotRegular as exc:
        raise ConfigError(f"{path}: cannot read hook settings: it is {exc.kind}, "
                          "not a regular file") from None
    except files.TooLarge:
        raise ConfigError(f"{path}: cannot read hook settings: larger than "
                          f"{SETTINGS_CAP} bytes") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read hook settings: {files.reason(exc)}") from None


def settings_hooks(data: bytes, path: str, timeout: float) -> list[Hook]:
    """The hooks of a Claude Code settings file's bytes (``disableAllHooks``: none)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to read; its hooks would not "
                          "run") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc}); its hooks would not run") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    if obj.get("disableAllHooks") is True:
        return []
    return parse_hooks(obj.get("hooks", {}), path, strict=False, default_timeout=timeout)


#: Lines of a trust question's summary (the question shows at most 20).
SUMMARY_LINES = 19


def admit(root: str, rel: str, data: bytes, kind: str, hooks: list[Hook],
          problem: ConfigError | None, *, review: bool = False) -> str:
    """Whether the hooks read from ``rel`` in the project ``root`` (the bytes ``data``) may
    run: "" when they may, else why not (the file is then inert).

    A file none of whose hooks would run (none, all of unsupported events, or
    ``disableAllHooks``) needs no trust. Otherwise :func:`dsh.config.trust.gate` decides: the
    approved digest, or the person's answer on a terminal (shown every hook's event, matcher
    and exact command); without one it prints one line naming the file and how to approve it.
    ``review``: no question and no line, only the state (``dsh hooks list``)."""
    runnable = [h for h in hooks if not h.ignored]
    if problem is None and not runnable:
        return ""
    from dsh.config import trust

    if review:
        state = trust.state(root, rel, data)
        if state == "trusted":
            return ""
        what = "changed since it was trusted" if state == "changed" else "not trusted"
        return f"{what}: dsh trust approve {os.path.join(root, rel)}"
    if trust.gate(root, rel, data, kind, summary(runnable, problem)):  # asks once per process
        return ""
    return "not trusted"


def summary(hooks: list[Hook], problem: ConfigError | None = None) -> str:
    """What a file would run, for the trust question: one line per hook, its event, matcher
    and exact command (as a JSON string: a newline in it cannot forge another line)."""
    if problem is not None:
        return _one_line(f"its hooks cannot be read: {problem}")
    lines = [_one_line(f"hook {h.event}, matcher {h.matcher or '*'}: "
                       f"{json.dumps(h.command, ensure_ascii=False)}") for h in hooks]
    if len(lines) > SUMMARY_LINES:
        more = len(lines) - SUMMARY_LINES + 1
        lines = [*lines[:SUMMARY_LINES - 1], f"… and {more} more hooks (dsh hooks list)"]
    return "\n".join(lines)


def policies(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``sandbox``: a table from hook source (:data:`SANDBOX_SOURCES`) to a policy (a name
    or a table, as ``[sandbox]``): every source it names, the confined ones as
    :class:`dsh.sandbox.Policy`, those set ``"off"`` as None."""
    table = raw.get("sandbox", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"[{where}] sandbox: expected a table of hook sources "
                          f"({', '.join(SANDBOX_SOURCES)}) to policies, got {table!r:.80}")
    out = {}
    for source, value in table.items():
        if source not in SANDBOX_SOURCES:
            raise ConfigError(f"[{where}] sandbox: unknown hook source {source!r}; valid: "
                              f"{', '.join(SANDBOX_SOURCES)}")
        from dsh.sandbox.policy import parse_policy

        policy = parse_policy(value, where=f"{where} sandbox.{source}")
        out[source] = policy if policy.confined else None
    return out


def policy_of(confine: Mapping[str, Any], source: str, from_project: bool,
              where: str) -> Any:
    """The policy of a hook of ``source`` (:func:`policies` is ``confine``; None:
    unconfined). Named in ``sandbox``: that policy, ``"off"`` included. Not named: none for
    the person's own hooks, :data:`PROJECT_SANDBOX` for the project's (``from_project``)."""
    if source in confine:
        return confine[source]
    if not from_project:
        return None
    from dsh.sandbox.policy import parse_policy

    return parse_policy(PROJECT_SANDBOX, where=f"{where} sandbox.{source}")


def parse_hooks(obj: Any, where: str, *, strict: bool, default_timeout: float) -> list[Hook]:
    """The protocol's ``hooks`` object as :class:`Hook` rows, in file order.

    ``strict`` (dsh's TOML): an unknown event is an error; in a Claude Code file it is kept
    as ignored (the file may serve other tools too)."""
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{where}: expected an object of events, got {obj!r:.80}")
    out: list[Hook] = []
    for event, groups in obj.items():
        ignored = "" if event in EVENTS else f"event {event} is not supported by dsh"
        if ignored and strict:
            import difflib

            near = difflib.get_close_matches(str(event), EVENTS, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; known: {', '.join(EVENTS)}"
            raise ConfigError(f"{where}: unknown event {event!r}{hint}")
        if not isinstance(groups, list):
            raise ConfigError(f"{where}.{event}: expected a list of matcher groups")
        for i, group in enumerate(groups):
            at = f"{where}.{event}[{i}]"
            if not isinstance(group, Mapping) or not isinstance(group.get("hooks"), list):
                raise ConfigError(f"{at}: expected {{\"matcher\": ..., \"hooks\": [...]}}")
            matcher = group.get("matcher", "")
            if not isinstance(matcher, str):
                raise ConfigError(f"{at}.matcher: expected a string, got {matcher!r}")
            _matcher_ok(matcher, at)
            for j, h in enumerate(group["hooks"]):
                hat = f"{at}.hooks[{j}]"
                if not isinstance(h, Mapping):
                    raise ConfigError(f"{hat}: expected an object with type and command")
                kind = h.get("type", "command")
                command = h.get("command")
                timeout = h.get("timeout", default_timeout)
                if not _positive(timeout):
                    raise ConfigError(f"{hat}.timeout: expected positive finite seconds, "
                                      f"got {timeout!r}")
                why = ignored or ("" if kind == "command"
                                  else f"hook type {kind!r} is not supported by dsh")
                if not why and (not isinstance(command, str) or not command.strip()):
                    raise ConfigError(f"{hat}.command: expected a non-empty string")
                out.append(Hook(str(event), matcher, str(command or ""), float(timeout),
                                where, why))
    return out


def _one_line(text: str) -> str:
    """``text`` with every character that ends a line (for :meth:`str.splitlines`) escaped:
    JSON leaves U+0085, U+2028 and U+2029 as they are."""
    out = []
    for c in text:
        if c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029":
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def _positive(value: Any) -> bool:
    """A positive finite number (not a boolean; NaN and infinities pass ``<= 0`` checks)."""
    import math

    return (not isinstance(value, bool) and isinstance(value, int | float)
            and math.isfinite(value) and value > 0)


def _matcher_ok(matcher: str, where: str) -> None:
    import re

    if matcher in ("", "*") or re.fullmatch(r"[\w|]+", matcher):
        return  # all, or exact names: not regexes (dsh_hooks.engine.matches)
    try:
        re.compile(matcher)
    except re.error as exc:
        raise ConfigError(f"{where}.matcher: {matcher!r} is not a valid regex ({exc})") from None


def _tools(raw: Any, where: str) -> dict[str, Alias]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"[{where}] tools: expected a table of dsh tool names")
    out = {}
    for name, spec in raw.items():
        if isinstance(spec, str):
            spec = {"name": spec}
        ok = (isinstance(spec, Mapping) and isinstance(spec.get("name"), str)
              and isinstance(spec.get("arguments", {}), Mapping)
              and all(isinstance(k, str) and isinstance(v, str)
                      for k, v in spec.get("arguments", {}).items())
              and isinstance(spec.get("paths", []), list))
        if not ok:
            raise ConfigError(f"[{where}] tools.{name}: expected \"Name\" or {{name = \"Name\", "
                              "arguments = {dsh_arg = \"protocol_arg\"}, paths = [...]}}")
        out[str(name)] = Alias(spec["name"], dict(spec.get("arguments", {})),
                               tuple(spec.get("paths", [])))
    return out
