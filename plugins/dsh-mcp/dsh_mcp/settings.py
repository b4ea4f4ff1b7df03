"""``[plugins.mcp]`` settings and ``.mcp.json`` files, read into frozen server descriptions.

Cheap on purpose: it runs at assembly of every agent that enables the plugin, so it imports
neither ``mcp`` nor ``asyncio`` (docs/mcp.md, start-up).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import ConfigError

if TYPE_CHECKING:
    from dsh_mcp.project import Project

#: The most bytes of an ``mcpServers`` file read.
MCP_JSON_CAP = 4 * 1024 * 1024
TOP_KEYS = ("servers", "mcp_json", "claude_plugins", "use", "timeout", "startup_timeout",
            "max_output", "sandbox", "approve")
SERVER_KEYS = ("command", "args", "env", "cwd", "url", "headers", "type", "timeout",
               "tools_allow", "tools_deny", "max_output", "sandbox", "approve")
#: The values of ``approve`` (docs/mcp.md, "Approval"): the tool only reads (runs in every
#: mode), asks as an MCP call does by default, or is always refused.
APPROVE_VALUES = ("read", "ask", "deny")
DEFAULT_TIMEOUT = 60.0
DEFAULT_STARTUP_TIMEOUT = 30.0
#: Bytes (UTF-8) of one tool output that are recorded; past it the middle is cut, marked.
DEFAULT_MAX_OUTPUT = 64 * 1024
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# Claude Code expands ${VAR} and ${VAR:-default} in .mcp.json; so do we, so its files work.
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@attrs.frozen(kw_only=True)
class Server:
    """One configured MCP server. ``env`` and ``headers`` values are secrets: they are in
    :attr:`key` (hashed) and sent to the server, never shown (:meth:`describe`)."""

    name: str
    transport: str  # "stdio" or "http" (streamable HTTP)
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict, hash=False, repr=False)
    cwd: str | None = None
    url: str = ""
    headers: Mapping[str, str] = attrs.field(factory=dict, hash=False, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    tools_allow: tuple[str, ...] | None = None
    tools_deny: tuple[str, ...] = ()
    max_output: int = DEFAULT_MAX_OUTPUT
    source: str = ""
    #: The values ``${VAR}`` expanded to in an ``mcpServers`` file: secrets (registered with
    #: :mod:`dsh.core.redact` when the file is read).
    expanded: tuple[str, ...] = attrs.field(default=(), hash=False, repr=False)
    #: The kernel sandbox of a stdio server's process (:class:`dsh.sandbox.Policy`); None:
    #: ``off`` (the default for the servers of the person's config: docs/mcp.md, "Sandbox").
    sandbox: Any = None
    #: The project root (real path) for a server a project file defines: its sandbox's
    #: workspace, and where its ``cwd`` must lie; ``None`` for the person's own servers.
    workspace: str | None = None
    #: ``approve`` (docs/mcp.md, "Approval"): the server's own tool name, or ``*``, to
    #: ``(value, the setting it comes from)``; a tool not in it asks. Only the person's config
    #: sets it (never an ``mcpServers`` file); not part of :attr:`key`.
    approve: Mapping[str, tuple[str, str]] = attrs.field(factory=dict, hash=False)

    @property
    def key(self) -> str:
        """A hash of what identifies the server process/endpoint: one started server and one
        cached tool list per key. Timeouts and tool filters are not part of it."""
        ident = {"transport": self.transport, "command": self.command, "args": self.args,
                 "env": dict(self.env), "cwd": self.cwd, "url": self.url,
                 "headers": dict(self.headers),
                 "sandbox": self.sandbox.record() if self.sandbox is not None else None}
        if self.workspace is not None:
            ident["workspace"] = self.workspace
        raw = json.dumps(ident, sort_keys=True, ensure_ascii=False).encode()
        return hashlib.sha256(raw).hexdigest()

    def describe(self) -> str:
        """How to show the server: command line or URL, without env/header values, expanded
        ``${VAR}`` values or URL credentials (redacted)."""
        from dsh.core.redact import redact

        if self.transport == "stdio":
            from shlex import join

            return redact(join([self.command, *self.args]))
        from dsh.core.redact import redact_url

        return redact(redact_url(self.url))

    def wants(self, tool: str) -> bool:
        """Whether ``tool`` (the server's own name) passes ``tools_allow`` / ``tools_deny``."""
        if tool in self.tools_deny:
            return False
        return self.tools_allow is None or tool in self.tools_allow

    def tool_name(self, tool: str) -> str:
        """The dsh name, ``mcp__SERVER__TOOL`` (Claude Code's convention); characters a
        provider refuses in a function name become ``_``."""
        return _UNSAFE.sub("_", f"mcp__{self.name}__{tool}")

    def approval(self, tool: str) -> tuple[str, str]:
        """``approve`` for ``tool`` (the server's own name): ``read``, ``ask`` or ``deny``,
        and the setting that says so (``""`` for the default, ``ask``)."""
        return self.approve.get(tool) or self.approve.get("*") or ("ask", "")


@attrs.frozen
class McpSettings:
    servers: Mapping[str, Server] = attrs.field(factory=dict, hash=False)


def parse_settings(raw: Mapping[str, Any], where: str, base_dir: Path | None = None
                   ) -> McpSettings:
    """Read the plugin's settings (``where`` names them in errors). ``mcp_json`` paths are
    relative to ``base_dir`` (default: the current directory); a missing file is skipped."""
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                          f"(known: {', '.join(TOP_KEYS)})")
    timeout = _number(raw, "timeout", DEFAULT_TIMEOUT, where)
    startup = _number(raw, "startup_timeout", DEFAULT_STARTUP_TIMEOUT, where)
    cap = _size(raw, "max_output", DEFAULT_MAX_OUTPUT, where)
    default_policy = _policy(raw, f"{where}: sandbox")
    default_approve = _approve(raw, f"{where}: approve")
    servers: dict[str, Server] = {}
    files = raw.get("mcp_json", [])
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise ConfigError(f"{where}: 'mcp_json' must be a path or a list of paths")
    project = None
    if files or raw.get("claude_plugins"):
        from dsh_mcp.project import project_of

        project = project_of(raw, where, base_dir)
    for name in files:
        path = Path(name).expanduser()
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        rel = project.rel_of(path) if project is not None else None
        if project is not None and rel is not None:  # the project's: trusted by content
            for server in read_project_mcp_json(project, rel, timeout, startup):
                servers[server.name] = attrs.evolve(server, max_output=cap)
            continue
        for server in read_mcp_json(path, timeout, startup):
            # A file of the person's own, named by their config; it cannot choose its own
            # sandbox: dsh's settings do.
            servers[server.name] = attrs.evolve(server, max_output=cap, sandbox=default_policy)
    if "claude_plugins" in raw:
        from dsh_mcp.plugin_folders import read_plugins

        for server in read_plugins(raw["claude_plugins"], where, base_dir or Path.cwd(),
                                   timeout, startup, project):
            own = {} if server.workspace is not None else {"sandbox": default_policy}
            servers[server.name] = attrs.evolve(server, max_output=cap, **own)
    table = raw.get("servers", {})
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: 'servers' must be a table of servers")
    for name, entry in table.items():
        server = parse_server(name, entry, f"{where}: servers.{name}", timeout, startup,
                              strict=True, max_output=cap)
        own = _policy(entry, f"{where}: servers.{name}.sandbox") if isinstance(
            entry, Mapping) and "sandbox" in entry else default_policy
        servers[name] = attrs.evolve(server, sandbox=own,
                                     approve=_approve(entry, f"{where}: servers.{name}.approve"))
    # The plugin-wide ``approve`` under each server's own; a project's server (whose tool
    # names the project chooses) is never made "read" by it: only asked or refused.
    servers = {name: attrs.evolve(server, approve=_layered(server, default_approve))
               for name, server in servers.items()}
    use = raw.get("use")
    if use is not None:
        if not isinstance(use, list) or not all(isinstance(u, str) for u in use):
            raise ConfigError(f"{where}: 'use' must be a list of server names")
        missing = [u for u in use if u not in servers]
        if missing:
            raise ConfigError(f"{where}: 'use' names unknown server(s) {', '.join(missing)} "
                              f"(configured: {', '.join(servers) or 'none'})")
        servers = {u: servers[u] for u in use}
    return McpSettings(servers)


def read_mcp_json(path: Path, timeout: float = DEFAULT_TIMEOUT,
                  startup: float = DEFAULT_STARTUP_TIMEOUT) -> list[Server]:
    """The servers of an ``mcpServers`` file of the person's own (Claude Code ``.mcp.json``,
    Cursor ``mcp.json``, Claude Desktop ``claude_desktop_config.json``), as written there:
    keys dsh does not use (``disabled``, ``autoApprove``, …) are ignored; ``${VAR}`` /
    ``${VAR:-default}`` are expanded from the environment (a secret never into ``command``
    or ``args``). A file in the project is read by :func:`read_project_mcp_json`."""
    try:
        data = read_json(path)
    except FileNotFoundError:
        return []
    entries = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise ConfigError(f"{path}: expected an object with 'mcpServers'")
    return servers_of(entries, f"{path}: mcpServers", timeout, startup)


def read_project_mcp_json(project: Project, rel: str, timeout: float = DEFAULT_TIMEOUT,
                          startup: float = DEFAULT_STARTUP_TIMEOUT) -> list[Server]:
    """The servers of the ``mcpServers`` file ``rel`` in the project
    (:class:`dsh_mcp.project.Project`): read beneath its root, used only when the person
    trusted these bytes (none otherwise: the file is inert), ``${VAR}`` refusing dsh's
    secrets and loader variables, each stdio server confined with the project root as its
    workspace."""
    from dsh_mcp import project as proj

    data = proj.load_gated(project, rel, proj.KIND, lambda raw: proj.summary(raw, project))
    if data is None:
        return []
    path = project.shown(rel)
    entries = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise ConfigError(f"{path}: expected an object with 'mcpServers'")
    servers = servers_of(entries, f"{path}: mcpServers", timeout, startup, project=True)
    return [project.confine(s) for s in servers]


def servers_of(entries: Mapping[str, Any], where: str, timeout: float, startup: float,
               expand: Any = None, *, project: bool = False) -> list[Server]:
    """The servers of an ``mcpServers`` object (``where`` names it in errors); ``expand``
    rewrites each entry first (``${CLAUDE_PLUGIN_ROOT}``); ``project``: the object comes
    from a project file (``${VAR}`` refuses dsh's secrets and loader variables)."""
    from dsh_mcp.project import Expansion

    rules = Expansion(project=project)
    servers = []
    for name, entry in entries.items():
        if isinstance(entry, dict) and entry.get("disabled") is True:
            continue
        if expand is not None:
            entry = expand(entry)
        expanded: list[str] = []
        here = f"{where}.{name}"
        if isinstance(entry, dict):
            entry = {k: _expand(v, expanded, rules, here, str(k)) for k, v in entry.items()}
        server = parse_server(name, entry, here, timeout, startup, strict=False)
        servers.append(attrs.evolve(server, expanded=tuple(expanded)))
    return servers


def read_json(path: Path) -> Any:
    """A JSON file, bounded (:func:`dsh.core.files.read_json`): :class:`FileNotFoundError`
    when it is missing, else a :class:`ConfigError`."""
    from dsh.core import files

    return files.read_json(path, MCP_JSON_CAP)


def parse_server(name: str, entry: Any, where: str, timeout: float, startup: float, *,
                 strict: bool, max_output: int = DEFAULT_MAX_OUTPUT) -> Server:
    if not _NAME.match(name):
        raise ConfigError(f"{where}: server names may use letters, digits, '_' and '-'")
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be a table")
    if strict:
        unknown = sorted(set(entry) - set(SERVER_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))} "
                              f"(known: {', '.join(SERVER_KEYS)})")
    kind = entry.get("type")
    has_url, has_command = "url" in entry, "command" in entry
    if kind in ("sse", "ws", "websocket"):
        raise ConfigError(f"{where}: transport {kind!r} is not supported "
                          "(stdio and streamable HTTP are)")
    if kind not in (None, "stdio", "http", "streamable-http", "streamableHttp"):
        raise ConfigError(f"{where}: unknown type {kind!r} (stdio or http)")
    if has_url == has_command:
        raise ConfigError(f"{where}: needs either 'command' (stdio) or 'url' (streamable HTTP)")
    common: dict[str, Any] = {
        "name": name, "source": where,
        "timeout": _number(entry, "timeout", timeout, where) if strict else timeout,
        "startup_timeout": startup,
        "tools_allow": _names(entry, "tools_allow", where, None),
        "tools_deny": _names(entry, "tools_deny", where, ()) or (),
        "max_output": _size(entry, "max_output", max_output, where) if strict else max_output,
    }
    if has_command:
        command = entry["command"]
        if not isinstance(command, str) or not command:
            raise ConfigError(f"{where}: 'command' must be a non-empty string")
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"{where}: 'args' must be a list of strings")
        cwd = entry.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ConfigError(f"{where}: 'cwd' must be a string")
        return Server(transport="stdio", command=command, args=tuple(args),
                      env=_strings(entry, "env", where), cwd=cwd, **common)
    url = entry["url"]
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: 'url' must be an http:// or https:// URL")
    return Server(transport="http", url=url, headers=_strings(entry, "headers", where),
                  **common)


def _expand(value: Any, expanded: list[str], rules: Any, where: str, key: str) -> Any:
    """``value`` (at ``key`` of the server ``where``) with ``${VAR}`` / ``${VAR:-default}``
    expanded. A variable ``rules`` (:class:`dsh_mcp.project.Expansion`) refuses — a secret on
    the command line, dsh's secrets or loader variables in a project file — is a
    :class:`ConfigError` naming the server, the key and the variable (never its value).
    Every expanded value is registered as a secret (:func:`dsh.core.redact.register`, which
    skips values too short or plain to be one) before anything can show it, and appended to
    ``expanded``."""
    if isinstance(value, str):
        def sub(m: re.Match[str]) -> str:
            from dsh.core.redact import register

            var = m.group(1)
            got = os.environ.get(var, m.group(2) or "")
            why = rules.refusal(var, got, key)
            if why is not None:
                raise ConfigError(f"{where}: {key}: ${{{var}}} is not expanded: {why}; the "
                                  "server is not started")
            register(got)
            expanded.append(got)
            return got

        return _VAR.sub(sub, value)
    if isinstance(value, list):
        return [_expand(v, expanded, rules, where, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _expand(v, expanded, rules, where, f"{key}.{k}") for k, v in value.items()}
    return value


def _policy(table: Mapping[str, Any], where: str) -> Any:
    """The ``sandbox`` of ``table`` as a :class:`dsh.sandbox.Policy`, None when absent or
    ``off``."""
    if table.get("sandbox") is None:
        return None
    from dsh.sandbox.policy import parse_policy

    policy = parse_policy(table["sandbox"], where=where)
    return policy if policy.confined else None


def _approve(table: Mapping[str, Any], setting: str) -> dict[str, tuple[str, str]]:
    """The ``approve`` of ``table`` (``setting`` names it in errors): one value for every
    tool, or a table of the server's own tool names (``"*"``: the others) to values; each
    with the name of the setting that gives it."""
    value = table.get("approve")
    if value is None:
        return {}
    known = "'read', 'ask' or 'deny'"
    if isinstance(value, str):
        value, whole = {"*": value}, True
    elif isinstance(value, Mapping):
        whole = False
    else:
        raise ConfigError(f"{setting}: must be {known}, or a table of tool names to one "
                          f"of them, not {_shown(value)}")
    out: dict[str, tuple[str, str]] = {}
    for tool, rule in value.items():
        here = setting if whole else \
            f"{setting}.{tool}" if _NAME.match(str(tool)) else f"{setting}.{json.dumps(tool)}"
        if not isinstance(rule, str) or rule not in APPROVE_VALUES:
            raise ConfigError(f"{here}: must be {known}, not {_shown(rule)}")
        out[str(tool)] = (rule, here)
    return out


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a table"
    return repr(value)[:60]


def _layered(server: Server, default: Mapping[str, tuple[str, str]]
             ) -> dict[str, tuple[str, str]]:
    """``server.approve`` over the plugin-wide ``default`` (a server's own ``"*"`` hides it
    all); for a project's server a default ``"read"`` becomes ``"ask"``."""
    if "*" in server.approve:
        return dict(server.approve)
    if server.workspace is not None:
        default = {k: ("ask", w) if v == "read" else (v, w) for k, (v, w) in default.items()}
    return {**default, **server.approve}


def _number(table: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value <= 0:  # NaN passes `<= 0`
        raise ConfigError(f"{where}: {key!r} must be a positive number of seconds")
    return float(value)


def _size(table: Mapping[str, Any], key: str, default: int, where: str) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
        raise ConfigError(f"{where}: {key!r} must be a number of bytes, at least 1024")
    return value


def _names(table: Mapping[str, Any], key: str, where: str,
           default: tuple[str, ...] | None) -> tuple[str, ...] | None:
    value = table.get(key)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key!r} must be a list of tool names")
    return tuple(value)


def _strings(table: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = table.get(key, {})
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        # The values are secrets: the message names the key, never a value.
        raise ConfigError(f"{where}: {key!r} must be a table of strings")
    return dict(value)
