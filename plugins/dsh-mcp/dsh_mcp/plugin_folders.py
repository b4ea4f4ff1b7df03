"""``claude_plugins``: the MCP servers of Claude Code plugin folders (docs/mcp.md).

For each folder: ``.mcp.json`` at its root (``{"mcpServers": {…}}``, or the servers object
itself, as plugins write it) and what ``.claude-plugin/plugin.json``'s ``mcpServers`` holds —
a path (or a list of paths) inside the folder, or the servers inline. Each is read like
``mcp_json``, with ``${CLAUDE_PLUGIN_ROOT}`` replaced by the folder's real path first (in
``command``, ``args``, ``env``, ``cwd``, ``url``, ``headers``) and ``CLAUDE_PLUGIN_ROOT`` in a
stdio server's environment. A path that leaves the folder (absolute, ``..``, a symbolic link
out) or a file that is not JSON is a :class:`~dsh.core.errors.ConfigError` naming the file
and key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dsh.core.errors import ConfigError
from dsh_mcp.settings import Server
from dsh_mcp.settings import read_json
from dsh_mcp.settings import servers_of

MANIFEST = os.path.join(".claude-plugin", "plugin.json")
MARK = "${CLAUDE_PLUGIN_ROOT}"


def read_plugins(raw: Any, where: str, base: Path, timeout: float, startup: float
                 ) -> list[Server]:
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        raise ConfigError(f"{where}: 'claude_plugins' must be a list of plugin folder paths")
    out: list[Server] = []
    for i, given in enumerate(raw):
        root = os.path.realpath(os.path.join(base, os.path.expanduser(given)))
        if not os.path.isdir(root):
            raise ConfigError(f"{where}: claude_plugins[{i}]: {given!r} is not a folder "
                              f"({root})")
        out.extend(_folder(root, timeout, startup))
    return out


def _folder(root: str, timeout: float, startup: float) -> list[Server]:
    def expand(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace(MARK, root)
        if isinstance(value, list):
            return [expand(v) for v in value]
        if isinstance(value, dict):
            out = {k: expand(v) for k, v in value.items()}
            if "command" in out and isinstance(out.get("env", {}), dict):
                out["env"] = {"CLAUDE_PLUGIN_ROOT": root, **out.get("env", {})}
            return out
        return value

    manifest_path = os.path.join(root, MANIFEST)
    manifest: Any = {}
    if os.path.lexists(manifest_path):
        manifest = read_json(Path(manifest_path))
        if not isinstance(manifest, dict):
            raise ConfigError(f"{manifest_path}: expected a JSON object")
    files: list[tuple[str, str]] = []
    default = os.path.join(root, ".mcp.json")
    if os.path.lexists(default):
        files.append((inside(root, ".mcp.json", f"{root}: .mcp.json"), ""))
    spec = manifest.get("mcpServers")
    servers: list[Server] = []
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, list):
        for j, rel in enumerate(spec):
            key = f"{manifest_path}: mcpServers" + (f"[{j}]" if len(spec) > 1 else "")
            if not isinstance(rel, str) or not rel:
                raise ConfigError(f"{key}: expected a path inside the plugin folder")
            path = inside(root, rel, key)
            if path not in [f for f, _ in files]:
                files.append((path, key))
    elif isinstance(spec, dict):
        entries = spec["mcpServers"] if isinstance(spec.get("mcpServers"), dict) else spec
        servers.extend(servers_of(entries, f"{manifest_path}: mcpServers", timeout, startup,
                                  expand))
    elif spec is not None:
        raise ConfigError(f"{manifest_path}: mcpServers: expected a path, a list of paths or "
                          f"an object, got {type(spec).__name__}")
    for path, key in files:
        try:
            data = read_json(Path(path))
        except ConfigError as exc:
            raise ConfigError(f"{exc} (named by {key})" if key else str(exc)) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object of servers")
        entries = data["mcpServers"] if isinstance(data.get("mcpServers"), dict) else data
        where = f"{path}: mcpServers" if entries is not data else path
        servers.extend(servers_of(entries, where, timeout, startup, expand))
    return servers


def inside(root: str, rel: str, key: str) -> str:
    """:func:`dsh.core.files.inside_folder`."""
    from dsh.core.files import inside_folder

    return inside_folder(root, rel, key)
