"""``claude_plugins``: the MCP servers of Claude Code plugin folders (docs/mcp.md).

For each folder: ``.mcp.json`` at its root (``{"mcpServers": {…}}``, or the servers object
itself, as plugins write it) and what ``.claude-plugin/plugin.json``'s ``mcpServers`` holds —
a path (or a list of paths) inside the folder, or the servers inline. Each is read like
``mcp_json``, with ``${CLAUDE_PLUGIN_ROOT}`` replaced by the folder's real path first (in
``command``, ``args``, ``env``, ``cwd``, ``url``, ``headers``) and ``CLAUDE_PLUGIN_ROOT`` in a
stdio server's environment. A path that leaves the folder (absolute, ``..``, a symbolic link
out) or a file that is not JSON is a :class:`~dsh.core.errors.ConfigError` naming the file
and key.

A folder that lies in the project is the project's (:mod:`dsh_mcp.project`): its files are
read beneath the project root and each one that defines servers (the manifest when it has
``mcpServers``, every servers file) is used only when the person trusted its bytes (kind
``plugin``); its servers are confined like those of the project's ``.mcp.json``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dsh.core.errors import ConfigError
from dsh_mcp.project import Project
from dsh_mcp.settings import MCP_JSON_CAP as _CAP
from dsh_mcp.settings import Server
from dsh_mcp.settings import read_json
from dsh_mcp.settings import servers_of

MANIFEST = os.path.join(".claude-plugin", "plugin.json")
MARK = "${CLAUDE_PLUGIN_ROOT}"


def read_plugins(raw: Any, where: str, base: Path, timeout: float, startup: float,
                 project: Project | None = None) -> list[Server]:
    if not isinstance(raw, list) or not all(isinstance(p, str) and p for p in raw):
        raise ConfigError(f"{where}: 'claude_plugins' must be a list of plugin folder paths")
    out: list[Server] = []
    for i, given in enumerate(raw):
        full = os.path.join(base, os.path.expanduser(given))
        key = f"{where}: claude_plugins[{i}]"
        rel = project.rel_of(full) if project is not None else None
        if project is not None and rel is not None:
            root = project.folder(rel, key)
            out.extend(project.confine(s) for s in _project_folder(
                project, os.path.normpath(rel), root, timeout, startup))
            continue
        root = os.path.realpath(full)
        if not os.path.isdir(root):
            raise ConfigError(f"{key}: {given!r} is not a folder ({root})")
        out.extend(_folder(root, timeout, startup))
    return out


def _expander(root: str) -> Any:
    """``${CLAUDE_PLUGIN_ROOT}`` replaced by ``root``, and set in a stdio server's env."""
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

    return expand


def _project_folder(project: Project, rel: str, root: str, timeout: float, startup: float
                    ) -> list[Server]:
    """A plugin folder in the project (``rel`` to its root, ``root`` its real path): each
    file that defines servers read beneath the project root and trusted by its bytes."""
    from dsh_mcp import project as proj

    expand = _expander(root)

    def load(name: str, bare: bool) -> Any:
        return proj.load_gated(project, os.path.join(rel, name), proj.PLUGIN_KIND,
                               lambda raw: proj.summary(raw, project, bare=bare))

    manifest_path = os.path.join(root, MANIFEST)
    manifest: Any = {}
    data = project.read(os.path.join(rel, MANIFEST), _CAP)
    if data is not None:
        import json

        try:
            manifest = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):
            manifest = None
        shaped = not isinstance(manifest, dict) or manifest.get("mcpServers") is not None
        # what the manifest names or holds shapes what runs: trusted by these bytes (an
        # untrusted one that is not even a JSON object is as inert as any other)
        if shaped and not project.trusted(os.path.join(rel, MANIFEST), data,
                                          proj.PLUGIN_KIND, _manifest_summary(manifest,
                                                                              project)):
            manifest = {}
        if not isinstance(manifest, dict):
            raise ConfigError(f"{manifest_path}: expected a JSON object")
    names: list[tuple[str, str]] = [(".mcp.json", "")]
    spec = manifest.get("mcpServers")
    servers: list[Server] = []
    if isinstance(spec, str):
        spec = [spec]
    if isinstance(spec, list):
        for j, name in enumerate(spec):
            key = f"{manifest_path}: mcpServers" + (f"[{j}]" if len(spec) > 1 else "")
            if not isinstance(name, str) or not name:
                raise ConfigError(f"{key}: expected a path inside the plugin folder")
            inside(root, name, key)  # the messages for a path that leaves the folder
            norm = os.path.normpath(name)
            if norm not in [n for n, _ in names]:
                names.append((norm, key))
    elif isinstance(spec, dict):
        entries = spec["mcpServers"] if isinstance(spec.get("mcpServers"), dict) else spec
        servers.extend(servers_of(entries, f"{manifest_path}: mcpServers", timeout, startup,
                                  expand, project=True))
    elif spec is not None:
        raise ConfigError(f"{manifest_path}: mcpServers: expected a path, a list of paths or "
                          f"an object, got {type(spec).__name__}")
    for name, key in names:
        try:
            data = load(name, True)
        except ConfigError as exc:
            raise ConfigError(f"{exc} (named by {key})" if key else str(exc)) from None
        if data is None:
            continue
        path = os.path.join(root, name)
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object of servers")
        entries = data["mcpServers"] if isinstance(data.get("mcpServers"), dict) else data
        where = f"{path}: mcpServers" if entries is not data else path
        servers.extend(servers_of(entries, where, timeout, startup, expand, project=True))
    return servers


def _manifest_summary(manifest: Any, project: Project) -> str:
    from dsh_mcp import project as proj

    if not isinstance(manifest, dict):
        return "(not a JSON object: nothing can run from it)"
    spec = manifest.get("mcpServers")
    if isinstance(spec, dict):
        inner = spec.get("mcpServers")
        return proj.summarize(inner if isinstance(inner, dict) else spec, project)
    if isinstance(spec, str):
        spec = [spec]
    named = ", ".join(map(str, spec)) if isinstance(spec, list) else repr(spec)
    return f"reads MCP servers from {named} (each trusted on its own)"


def _folder(root: str, timeout: float, startup: float) -> list[Server]:
    expand = _expander(root)
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
