"""``[plugins.hooks]``: dsh's own hooks table and the Claude Code settings files it opts into.

The ``hooks`` object has Claude Code's structure, whichever file it comes from::

    {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "...",
                                                  "timeout": 60}]}]}

A malformed table is a :class:`dsh.core.errors.ConfigError` naming the file and the key: a guard
that silently does not load is worse than a run that does not start. Events dsh does not map
(``Notification``, …) and hook types other than ``command`` are kept aside, listed by
``dsh hooks list`` and never run.
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
KEYS = ("hooks", "claude_settings", "claude_plugins", "project_dir", "tools", "env_keep",
        "max_output", "timeout", "sandbox")
#: The hook sources a ``sandbox`` table names: ``config`` (dsh's own TOML) and each settings
#: file. Every source is unconfined unless its policy is set (its hooks were written by you).
SANDBOX_SOURCES = ("config", *SOURCES, "claude_plugins")
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


def load(raw: Mapping[str, Any], where: str, workspace: str | None) -> HookSettings:
    """The hooks of one agent: the TOML table, then each opted-in settings file (I/O)."""
    check(raw, where)
    project = os.path.realpath(os.path.expanduser(
        raw.get("project_dir") or workspace or os.getcwd()))
    timeout = float(raw.get("timeout", DEFAULT_TIMEOUT))
    confine = policies(raw, where)
    hooks = [attrs.evolve(h, policy=confine.get("config"))
             for h in parse_hooks(raw.get("hooks", {}), f"[{where}] hooks", strict=True,
                                  default_timeout=timeout)]
    missing = []
    for name in raw.get("claude_settings", []):
        rel = SOURCES[name]
        path = os.path.expanduser(rel) if rel.startswith("~") else os.path.join(project, rel)
        from dsh.core import files

        try:  # bounded, and a FIFO or a device is refused instead of blocking the run
            text = files.read_regular(path, SETTINGS_CAP).decode("utf-8")
        except FileNotFoundError:
            missing.append(path)
            continue
        except files.NotRegular as exc:
            raise ConfigError(f"{path}: cannot read hook settings: it is {exc.kind}, "
                              "not a regular file") from None
        except files.TooLarge:
            raise ConfigError(f"{path}: cannot read hook settings: larger than "
                              f"{SETTINGS_CAP} bytes") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read hook settings: {files.reason(exc)}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from None
        try:
            data = json.loads(text)
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply to read; its hooks would not "
                              "run") from None
        except ValueError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc}); its hooks would not run") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
        if data.get("disableAllHooks") is True:
            continue
        hooks.extend(attrs.evolve(h, policy=confine.get(name))
                     for h in parse_hooks(data.get("hooks", {}), path, strict=False,
                                          default_timeout=timeout))
    if raw.get("claude_plugins"):
        from dsh_hooks import plugin_folders

        hooks.extend(attrs.evolve(h, policy=confine.get("claude_plugins"))
                     for h in plugin_folders.load(raw["claude_plugins"], where, project,
                                                  timeout))
    tools = dict(DEFAULT_TOOLS)
    tools.update(_tools(raw.get("tools", {}), where))
    return HookSettings(tuple(hooks), project, tools, tuple(raw.get("env_keep", [])),
                        int(raw.get("max_output", DEFAULT_MAX_OUTPUT)), tuple(missing))


def policies(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``sandbox``: a table from hook source (:data:`SANDBOX_SOURCES`) to a policy (a name
    or a table, as ``[sandbox]``); the confined ones as :class:`dsh.sandbox.Policy`."""
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
        if policy.confined:
            out[source] = policy
    return out


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
