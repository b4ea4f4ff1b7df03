"""dsh-mcp's ``claude_plugins`` (issue 24): the MCP servers of Claude Code plugin folders —
``.mcp.json`` at the folder's root or ``plugin.json``'s ``mcpServers`` (a path inside the folder
or inline) — with ``${CLAUDE_PLUGIN_ROOT}`` expanded; a real SDK server started from the
folder, and folders whose manifest lies about its paths."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import ConfigError
from dsh.run.app import App
from tests.test_mcp_plugin import SERVER
from tests.test_mcp_plugin import _require_installed  # noqa: F401 - the autouse fixture
from tests.test_mcp_plugin import run_tool


def _plugin(base: Path, name: str, *, manifest: dict[str, Any] | None = None,
            mcp_json: dict[str, Any] | None = None) -> Path:
    root = base / name
    (root / ".claude-plugin").mkdir(parents=True)
    (root / "servers").mkdir()
    shutil.copy(SERVER, root / "servers" / "server.py")
    (root / ".claude-plugin" / "plugin.json").write_text(json.dumps(
        manifest if manifest is not None else {"name": name}))
    if mcp_json is not None:
        (root / ".mcp.json").write_text(json.dumps(mcp_json))
    return root


SERVER_ENTRY = {"command": sys.executable,
                "args": ["${CLAUDE_PLUGIN_ROOT}/servers/server.py", "stdio"]}


def _app(tmp_path: Path, *folders: Path) -> App:
    return App.from_config({
        "sessions_dir": str(tmp_path / "sessions"),
        "plugins": {"mcp": {"claude_plugins": [str(f) for f in folders]}},
        "agents": {"a": {"plugins": ["mcp"]}}, "agent": "a"})


@pytest.mark.parametrize("shape", ["mcp.json", "mcp.json-bare", "manifest-path", "inline"])
def test_plugin_folder_servers_start_with_the_plugin_root(tmp_path: Path, shape: str) -> None:
    if shape == "mcp.json":
        root = _plugin(tmp_path, "p", mcp_json={"mcpServers": {"notes": SERVER_ENTRY}})
    elif shape == "mcp.json-bare":  # the servers object itself, as plugins often write it
        root = _plugin(tmp_path, "p", mcp_json={"notes": SERVER_ENTRY})
    elif shape == "manifest-path":
        root = _plugin(tmp_path, "p", manifest={"name": "p", "mcpServers": "./cfg/mcp.json"})
        (root / "cfg").mkdir()
        (root / "cfg" / "mcp.json").write_text(json.dumps({"mcpServers": {
            "notes": SERVER_ENTRY}}))
    else:
        root = _plugin(tmp_path, "p", manifest={"name": "p", "mcpServers": {
            "notes": SERVER_ENTRY}})
    app = _app(tmp_path, root)
    out = run_tool(app, "mcp__notes__echo", {"text": "from a plugin"})
    assert (out.status, out.output) == ("ok", "from a plugin")
    names = run_tool(app, "mcp__notes__env_names", {}).output.split()
    assert "CLAUDE_PLUGIN_ROOT" in names
    # the filesystem server's result shape, through the plugin's server: the text once
    out = run_tool(app, "mcp__notes__read_note", {"name": "x"})
    assert out.output == "note x:\nline two"


@pytest.mark.parametrize(("lie", "message"), [
    ("../outside.json", "leads out of the plugin folder"),
    ("/etc/hostname", "is an absolute path"),
    ("link.json", "leads out of the plugin folder"),
    ("fifo.json", "not a regular file"),
    ("bad.json", "not valid JSON"),
    (["ok.json", 3], "mcpServers[1]: expected a path"),
    (5, "expected a path, a list of paths or an object"),
])
def test_plugin_manifest_lying_about_mcp_paths(tmp_path: Path, lie: Any, message: str) -> None:
    (tmp_path / "outside.json").write_text(json.dumps({"mcpServers": {"x": SERVER_ENTRY}}))
    root = _plugin(tmp_path, "liar", manifest={"name": "liar", "mcpServers": lie})
    (root / "link.json").symlink_to(tmp_path / "outside.json")
    os.mkfifo(root / "fifo.json")
    (root / "bad.json").write_text("{nope")
    (root / "ok.json").write_text("{}")
    with pytest.raises(ConfigError) as err:
        _app(tmp_path, root).agent()
    text = str(err.value)
    assert message in text and str(root) in text and "mcpServers" in text
    assert "\n" not in text


def test_plugin_folders_setting_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'claude_plugins' must be a list"):
        App.from_config({"plugins": {"mcp": {"claude_plugins": "x"}},
                         "agents": {"a": {"plugins": ["mcp"]}}, "agent": "a"}).agent()
    with pytest.raises(ConfigError, match=r"claude_plugins\[0\]: .* is not a folder"):
        _app(tmp_path, tmp_path / "missing").agent()
    root = _plugin(tmp_path, "p", mcp_json={"mcpServers": {"bad name!": SERVER_ENTRY}})
    with pytest.raises(ConfigError, match=r"\.mcp\.json: mcpServers\.bad name!"):
        _app(tmp_path, root).agent()
