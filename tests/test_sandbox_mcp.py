"""MCP stdio servers under the kernel sandbox (issue 22): per server, off by default.

A real server (tests/mcp_test_server.py) is started confined; what confines it is read from
outside (``/proc/PID/status`` of the server the test found by its mark) and from the ledger.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsh.run.app import App

pytest.importorskip("dsh_mcp", reason="pip install ./plugins/dsh-mcp")
pytest.importorskip("mcp", reason="the MCP SDK is not installed")

from dsh.sandbox.spawn import check  # noqa: E402
from tests.test_mcp_plugin import SERVER  # noqa: E402
from tests.test_mcp_plugin import call  # noqa: E402
from tests.test_mcp_plugin import dsh  # noqa: E402
from tests.test_mcp_plugin import events  # noqa: E402
from tests.test_mcp_plugin import ledger_events  # noqa: E402
from tests.test_mcp_plugin import run_tool  # noqa: E402
from tests.test_mcp_plugin import script  # noqa: E402
from tests.test_mcp_plugin import stdio_server  # noqa: E402
from tests.test_mcp_plugin import write_config  # noqa: E402
from tests.test_sandbox import without_landlock  # noqa: E402

_CHECK = check()
needs_sandbox = pytest.mark.skipif(not _CHECK.get("backend"),
                                   reason=f"no sandbox on this machine: {_CHECK.get('why')}")


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


@needs_sandbox
def test_a_sandboxed_server_runs_confined_and_each_call_records_it(tmp_path: Path) -> None:
    from dsh_mcp import client

    ws, marks = tmp_path / "ws", tmp_path / "marks"
    ws.mkdir()
    marks.mkdir()
    server = stdio_server(marks, "sbx-confined", cwd=str(ws),
                          sandbox={"policy": "workspace-write", "write": [str(marks)],
                                   "read": [str(Path(SERVER).parent)]})  # its own code
    app = App.from_config({"sessions_dir": str(tmp_path / "s"),
                           "plugins": {"mcp": {"servers": {"t": server}}}})
    try:
        out = run_tool(app, "mcp__t__echo", {"text": "hi"})
        assert out.status == "ok" and "hi" in out.output, out.output
        [pid] = [int(e.split()[1]) for e in events(marks) if e.startswith("start ")]
        status = _status(pid)
        assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
        assert status["CapEff"].strip() == "0000000000000000"
    finally:
        client.shutdown()


@needs_sandbox
def test_a_project_server_is_confined_by_default(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A server of the project's ``.mcp.json`` (approved) runs under the sandbox with no
    ``sandbox`` setting at all, its workspace the project root (tests/test_mcp_trust.py)."""
    import shutil

    from dsh_mcp import client

    from dsh.config import trust

    proj = tmp_path / "proj"
    marks = proj / "marks"
    marks.mkdir(parents=True)
    shutil.copy(SERVER, proj / "server.py")
    data = json.dumps({"mcpServers": {"p": {
        "command": sys.executable, "args": ["server.py", "stdio", "sbx-project"],
        "env": {"MCP_TEST_MARKS": str(marks)}}}}).encode()
    (proj / ".mcp.json").write_bytes(data)
    monkeypatch.setattr(trust, "TTY", "/nonexistent/tty")
    trust.approve(proj, ".mcp.json", trust.digest(data), "mcp")
    monkeypatch.chdir(proj)
    app = App.from_config({"sessions_dir": str(tmp_path / "s"),
                           "plugins": {"mcp": {"mcp_json": ".mcp.json"}}})
    try:
        out = run_tool(app, "mcp__p__echo", {"text": "hi"})
        assert out.status == "ok" and "hi" in out.output, out.output
        [pid] = [int(e.split()[1]) for e in events(marks) if e.startswith("start ")]
        status = _status(pid)
        assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
    finally:
        client.shutdown()


def test_servers_are_unconfined_by_default_and_the_ledger_says_so(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    cfg = write_config(tmp_path, {"t": stdio_server(marks, "sbx-default")})
    model = script(tmp_path, call("mcp__t__echo", text="hello"), {"text": "done"})
    proc = dsh("--config", str(cfg), "run", "--yes", "-m", model, "go",
               env={**os.environ, "DSH_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0, proc.stderr
    [pid] = [int(e.split()[1]) for e in events(marks) if e.startswith("start ")]
    assert pid > 0
    record = next(e["data"] for e in ledger_events(tmp_path) if e["type"] == "x/mcp/sandbox")
    assert record["policy"] == "off" and record["server"] == "t"
    assert record["call_id"] == next(e["call_id"] for e in ledger_events(tmp_path)
                                     if e["type"] == "tool/call")


def test_without_landlock_a_sandboxed_server_does_not_start(tmp_path: Path) -> None:
    ws, marks = tmp_path / "ws", tmp_path / "marks"
    ws.mkdir()
    marks.mkdir()
    cfg = write_config(tmp_path, {"t": stdio_server(marks, "sbx-refused", cwd=str(ws),
                                                    sandbox="workspace-write")})
    model = script(tmp_path, call("mcp__t__echo", text="hello"), {"text": "done"})
    proc = subprocess.run(without_landlock("-m", "dsh", "--config", str(cfg), "run", "-m",
                                           model, "go"), capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DSH_HOME": str(tmp_path / "home")})
    # the tool list could not be fetched: the server never ran, and the error says why
    assert events(marks) == []
    assert "dsh: sandbox: cannot confine the command (the kernel has no Landlock (ENOSYS))" \
        in proc.stderr + json.dumps(ledger_events(tmp_path)), proc.stderr


def test_a_bad_server_policy_is_a_config_error_naming_the_server(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"t": {"command": sys.executable,
                                        "sandbox": {"network": "maybe"}}})
    proc = dsh("--config", str(cfg), "run", "-m", "echo", "hi")
    assert proc.returncode == 2
    assert "servers.t.sandbox] network: expected true or false" in proc.stderr
