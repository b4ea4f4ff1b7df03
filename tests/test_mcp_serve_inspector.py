"""``dsh mcp serve`` driven by the MCP Inspector's CLI (the official reference client, from
npm: ``npm ci --prefix tests/js``), over stdio and streamable HTTP: the tools list, run,
resume and fork as another agent would call them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_mcp")
pytest.importorskip("dsh_shell")

from tests.test_mcp_serve import TIMEOUT  # noqa: E402
from tests.test_mcp_serve import WRITE  # noqa: E402
from tests.test_mcp_serve import config  # noqa: E402
from tests.test_mcp_serve import env  # noqa: E402
from tests.test_mcp_serve import http_server  # noqa: E402
from tests.test_mcp_serve import ledger  # noqa: E402

INSPECTOR = Path(__file__).parent / "js" / "node_modules" / ".bin" / "mcp-inspector"


@pytest.fixture
def inspector(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """``inspector(TARGET..., method=..., tool=..., **arguments)``: one Inspector CLI call,
    its JSON answer. Skipped without node; a failure without tests/js/node_modules."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    if not INSPECTOR.exists():
        pytest.fail("the MCP Inspector CLI is missing: run npm ci --prefix tests/js")
    home = tmp_path / "inspector-home"
    home.mkdir()

    def call(*target: str, method: str, tool: str | None = None,
             **arguments: Any) -> dict[str, Any]:
        argv = [str(INSPECTOR), "--cli", "--method", method]
        if tool is not None:
            argv += ["--tool-name", tool]
        for key, value in arguments.items():
            argv += ["--tool-arg", f"{key}={value}"]
        proc = subprocess.run([*argv, "--", *target], capture_output=True, text=True,
                              timeout=TIMEOUT, stdin=subprocess.DEVNULL,
                              env={**env(), "HOME": str(home),
                                   "MCP_CATALOG_PATH": str(home / "mcp.json")})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return dict(json.loads(proc.stdout))

    return call


def _serve(cfg: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "dsh", "--config", str(cfg), "mcp", "serve", *args]


def test_the_inspector_over_stdio(tmp_path: Path, script: Callable[..., str],
                                  inspector: Callable[..., dict[str, Any]]) -> None:
    cfg = config(tmp_path, script(WRITE, {"text": "hi from dsh"}, {"text": "resumed"},
                                  {"text": "from the fork"}))
    server = _serve(cfg, "--mode", "auto-edit")
    listed = inspector(*server, method="tools/list")
    assert [t["name"] for t in listed["tools"]] == ["run", "resume", "fork", "search"]
    assert listed["tools"][0]["inputSchema"]["required"] == ["prompt"]
    ran = inspector(*server, method="tools/call", tool="run", prompt="hi")
    assert ran["isError"] is False
    sid = ran["structuredContent"]["session"]
    assert ran["structuredContent"]["output"] == "hi from dsh"
    assert (tmp_path / "ws" / "notes.txt").read_text() == "changed"
    resumed = inspector(*server, method="tools/call", tool="resume", session=sid,
                        prompt="again")
    assert resumed["structuredContent"] == {"session": sid, "output": "resumed",
                                            "outcome": "completed"}
    forked = inspector(*server, method="tools/call", tool="fork", session=sid, at=1)
    new = forked["structuredContent"]["session"]
    assert forked["structuredContent"]["parent"] == sid and new != sid
    # the fork holds turn 1 only: resuming it is the script's second answer's turn again
    again = inspector(*server, method="tools/call", tool="resume", session=new, prompt="fork")
    assert again["structuredContent"]["output"] == "resumed"
    assert [e["text"] for e in ledger(tmp_path, new) if e["type"] == "user/message"] == [
        "hi", "fork"]
    assert os.listdir(tmp_path / "inspector-home") in ([], ["mcp.json"])


def test_the_inspector_over_http(tmp_path: Path, script: Callable[..., str],
                                 inspector: Callable[..., dict[str, Any]]) -> None:
    cfg = config(tmp_path, script({"text": "over http"}))
    with http_server(cfg) as (url, proc):
        listed = inspector(url, method="tools/list")
        ran = inspector(url, method="tools/call", tool="run", prompt="hi")
        assert proc.poll() is None
    assert [t["name"] for t in listed["tools"]] == ["run", "resume", "fork", "search"]
    assert ran["structuredContent"]["output"] == "over http"
