"""MCP tool calls go through dsh's one approval service (docs/mcp.md, "Approval";
docs/security.md, "Permission modes and approvals").

Real ``dsh run`` processes with no controlling terminal (a new session, stdin from
/dev/null: no one to ask), the scripted model, and tests/mcp_test_server.py, whose ``sleep``
tool appends ``begin TAG`` to its marks file when it runs: whether the server's tool ran is
read from outside, and why from the ledger's ``x/dsh.tools/approval`` event.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dsh.config import trust

pytest.importorskip("dsh_mcp", reason="pip install ./plugins/dsh-mcp")
pytest.importorskip("mcp", reason="the MCP SDK is not installed")

from dsh.sandbox.spawn import check  # noqa: E402
from tests.test_mcp_plugin import SERVER  # noqa: E402
from tests.test_mcp_plugin import _require_installed  # noqa: E402,F401 - the autouse fixture
from tests.test_mcp_plugin import call  # noqa: E402
from tests.test_mcp_plugin import dsh as run_dsh  # noqa: E402
from tests.test_mcp_plugin import events  # noqa: E402
from tests.test_mcp_plugin import ledger_events  # noqa: E402
from tests.test_mcp_plugin import script  # noqa: E402
from tests.test_mcp_plugin import stdio_server  # noqa: E402
from tests.test_mcp_plugin import write_config  # noqa: E402

_CHECK = check()
needs_sandbox = pytest.mark.skipif(not _CHECK.get("backend"),
                                   reason=f"no sandbox on this machine: {_CHECK.get('why')}")


def dsh(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``dsh`` with no controlling terminal and nothing on stdin: no one to ask."""
    return run_dsh(*args, cwd=str(cwd) if cwd else None, stdin=subprocess.DEVNULL,
                   start_new_session=True)


def sleep_call(server: str, tag: str) -> dict[str, Any]:
    return call(f"mcp__{server}__sleep", seconds=0, tag=tag)


def ran(marks: Path, tag: str) -> bool:
    return f"begin {tag}" in events(marks)


def results(tmp_path: Path) -> list[dict[str, Any]]:
    return [e for e in ledger_events(tmp_path) if e["type"] == "tool/result"]


def decisions(tmp_path: Path) -> list[dict[str, Any]]:
    return [e["data"] for e in ledger_events(tmp_path) if e["type"] == "x/dsh.tools/approval"]


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    return path


def one_server(tmp_path: Path, marks: Path, tag: str, **extra: Any) -> Path:
    return write_config(tmp_path, {"s": stdio_server(marks, tag, **extra)})


def test_without_a_terminal_an_mcp_call_is_refused_and_the_server_tool_does_not_run(
        tmp_path: Path, marks: Path) -> None:
    cfg = one_server(tmp_path, marks, "appr-default")
    model = script(tmp_path, sleep_call("s", "appr-default"), {"text": "done"})
    proc = dsh("--config", str(cfg), "run", "-m", model, "go")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert not ran(marks, "appr-default")
    [result] = results(tmp_path)
    assert result["name"] == "mcp__s__sleep" and result["status"] == "error"
    out = result["output"]
    assert out.startswith("mcp__s__sleep was not run: ") and "no terminal" in out, out
    assert "--yes" in out and "outside dsh's sandbox" in out, out
    [decision] = decisions(tmp_path)
    assert decision | {"call": None, "why": ""} == {
        "call": None, "why": "", "tool": "mcp__s__sleep", "action": "outside",
        "subject": 'sleep {"seconds": 0, "tag": "appr-default"}', "allowed": False,
        "by": "no-terminal", "mode": "ask"}
    assert decision["call"] == result["call_id"]


def test_yes_runs_it_and_the_ledger_says_so(tmp_path: Path, marks: Path) -> None:
    cfg = one_server(tmp_path, marks, "appr-yes")
    model = script(tmp_path, sleep_call("s", "appr-yes"), {"text": "done"})
    proc = dsh("--config", str(cfg), "run", "--yes", "-m", model, "go")
    assert proc.returncode == 0, proc.stderr
    assert ran(marks, "appr-yes")
    [result] = results(tmp_path)
    assert (result["status"], result["output"]) == ("ok", "slept 0.0")
    [decision] = decisions(tmp_path)
    assert (decision["allowed"], decision["by"], decision["action"]) == (True, "yes", "outside")


def test_approve_read_runs_the_tool_in_every_mode_without_yes(tmp_path: Path,
                                                              marks: Path) -> None:
    """The person vouches in their own config that ``sleep`` only reads: it runs even in
    ``read-only``, like a file read; the server's other tools still ask."""
    cfg = one_server(tmp_path, marks, "appr-read", approve={"sleep": "read"})
    model = script(tmp_path, sleep_call("s", "appr-read"), call("mcp__s__echo", text="hi"),
                   {"text": "done"})
    proc = dsh("--config", str(cfg), "run", "--mode", "read-only", "-m", model, "go")
    assert proc.returncode == 0, proc.stderr
    assert ran(marks, "appr-read")
    slept, echoed = results(tmp_path)
    assert (slept["status"], slept["output"]) == ("ok", "slept 0.0")
    assert echoed["status"] == "error" and "permission mode is read-only" in echoed["output"]
    first, second = decisions(tmp_path)
    assert (first["tool"], first["action"], first["allowed"], first["by"], first["mode"]) == (
        "mcp__s__sleep", "read", True, "mode", "read-only")
    assert (second["tool"], second["action"], second["allowed"], second["by"]) == (
        "mcp__s__echo", "outside", False, "mode")


def config_with(tmp_path: Path, **mcp: Any) -> Path:
    import tomli_w

    path = tmp_path / "dsh.toml"
    path.write_text(tomli_w.dumps({"sessions_dir": str(tmp_path / "sessions"),
                                   "plugins": {"mcp": mcp}}))
    return path


def test_the_plugin_wide_approve_is_the_default_under_a_servers_own(tmp_path: Path,
                                                                    marks: Path) -> None:
    cfg = config_with(tmp_path, approve="read", servers={
        "s": stdio_server(marks, "appr-wide"),
        "d": stdio_server(marks, "appr-wide-d", approve={"*": "deny"})})
    model = script(tmp_path, sleep_call("s", "appr-wide"), sleep_call("d", "appr-wide-d"),
                   {"text": "done"})
    proc = dsh("--config", str(cfg), "run", "-m", model, "go")
    assert proc.returncode == 0, proc.stderr
    assert ran(marks, "appr-wide") and not ran(marks, "appr-wide-d")
    assert [(d["tool"], d["allowed"], d["by"]) for d in decisions(tmp_path)] == [
        ("mcp__s__sleep", True, "mode"), ("mcp__d__sleep", False, "config")]


def test_approve_deny_refuses_even_with_yes(tmp_path: Path, marks: Path) -> None:
    cfg = one_server(tmp_path, marks, "appr-deny", approve={"*": "deny"})
    model = script(tmp_path, sleep_call("s", "appr-deny"), {"text": "done"})
    proc = dsh("--config", str(cfg), "run", "--yes", "--mode", "full-auto", "-m", model, "go")
    assert proc.returncode == 0, proc.stderr
    assert not ran(marks, "appr-deny")
    [result] = results(tmp_path)
    assert result["status"] == "error"
    assert result["output"] == (
        "mcp__s__sleep was not run: the person's config refuses it (plugins.mcp, agent "
        'default: servers.s.approve."*" = "deny"); do not retry it')
    [decision] = decisions(tmp_path)
    assert (decision["allowed"], decision["by"], decision["tool"]) == (
        False, "config", "mcp__s__sleep")


@pytest.mark.parametrize(("where", "value", "message"), [
    ("server", "always", "plugins.mcp, agent default: servers.s.approve: must be 'read', "
                         "'ask' or 'deny', not 'always'"),
    ("server", {"sleep": "yes"}, "plugins.mcp, agent default: servers.s.approve.sleep: must "
                                 "be 'read', 'ask' or 'deny', not 'yes'"),
    ("server", ["read"], "plugins.mcp, agent default: servers.s.approve: must be 'read', "
                         "'ask' or 'deny', or a table of tool names to one of them, not a list"),
    ("top", 1, "plugins.mcp, agent default: approve: must be 'read', 'ask' or 'deny', or a "
               "table of tool names to one of them, not 1"),
])
def test_a_bad_approve_value_is_a_config_error_naming_the_key(
        tmp_path: Path, marks: Path, where: str, value: Any, message: str) -> None:
    extra = {"approve": value} if where == "server" else {}
    cfg = one_server(tmp_path, marks, "appr-bad", **extra)
    if where == "top":
        cfg = config_with(tmp_path, approve=value,
                          servers={"s": stdio_server(marks, "appr-bad")})
    proc = dsh("--config", str(cfg), "run", "-m", "echo", "hi")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"dsh: error: {message}"]
    assert events(marks) == []  # nothing started


@needs_sandbox
def test_full_auto_runs_a_confined_servers_tool_and_refuses_an_unconfined_one(
        tmp_path: Path, marks: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    confined = stdio_server(marks, "appr-confined", cwd=str(ws),
                            sandbox={"policy": "workspace-write", "write": [str(marks)],
                                     "read": [str(Path(SERVER).parent)]})
    cfg = write_config(tmp_path, {"c": confined,
                                  "u": stdio_server(marks, "appr-unconfined")})
    model = script(tmp_path, sleep_call("c", "appr-confined"),
                   sleep_call("u", "appr-unconfined"), {"text": "done"})
    proc = dsh("--config", str(cfg), "run", "--mode", "full-auto", "-m", model, "go")
    assert proc.returncode == 0, proc.stderr
    assert ran(marks, "appr-confined") and not ran(marks, "appr-unconfined")
    ok, refused = results(tmp_path)
    assert (ok["name"], ok["status"]) == ("mcp__c__sleep", "ok")
    assert refused["name"] == "mcp__u__sleep" and refused["status"] == "error"
    assert "no terminal" in refused["output"]
    first, second = decisions(tmp_path)
    assert (first["action"], first["allowed"], first["by"]) == ("command", True, "mode")
    assert (second["action"], second["allowed"], second["by"]) == (
        "outside", False, "no-terminal")
    # Without full-auto the confined server's call asks too: refused here, naming the mode.
    model = script(tmp_path, sleep_call("c", "appr-confined-2"), {"text": "done"},
                   name="ask.json")
    proc = dsh("--config", str(cfg), "run", "-m", model, "go")
    assert proc.returncode == 0, proc.stderr
    assert not ran(marks, "appr-confined-2")
    assert "--mode full-auto" in results(tmp_path)[-1]["output"]


def _mcp_json_server(tmp_path: Path, where: str) -> tuple[Path, Path, Path]:
    """An ``mcpServers`` file whose entry says ``"approve": "read"``: in the project (the
    folder dsh runs in; trusted) or the person's own, outside it. Returns (config, the folder
    to run in, marks)."""
    import tomli_w

    proj = tmp_path / "proj"
    proj.mkdir()
    folder = proj if where.startswith("project") else tmp_path / "own"
    folder.mkdir(exist_ok=True)
    shutil.copy(SERVER, folder / "server.py")
    marks = folder / "marks"
    marks.mkdir()
    entry = {"command": sys.executable, "args": [str(folder / "server.py"), "stdio", "jsn"],
             "env": {"MCP_TEST_MARKS": str(marks)}, "approve": "read",
             "autoApprove": ["sleep"]}
    data = json.dumps({"mcpServers": {"j": entry}}).encode()
    (folder / ".mcp.json").write_bytes(data)
    if folder == proj:
        trust.approve(proj, ".mcp.json", trust.digest(data), "mcp")
    # "project-wide": the person's plugin-wide approve = "read" does not reach a project's
    # server either (its tool names are the project's choice).
    wide = {"approve": "read"} if where == "project-wide" else {}
    cfg = tmp_path / "dsh.toml"
    cfg.write_text(tomli_w.dumps({"sessions_dir": str(tmp_path / "sessions"), "plugins": {
        "mcp": {"mcp_json": str(folder / ".mcp.json"), **wide}}}))
    return cfg, proj, marks


@pytest.mark.parametrize("where", [
    pytest.param("project", marks=needs_sandbox), pytest.param("project-wide",
                                                               marks=needs_sandbox), "own"])
def test_an_mcp_json_entry_cannot_approve_its_own_tools(tmp_path: Path, where: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``approve`` (or Claude Code's ``autoApprove``) in an ``mcpServers`` file is not
    honoured: only the person's dsh config says a tool only reads, and its plugin-wide
    ``approve = "read"`` never makes a project's server's tool a read."""
    monkeypatch.setattr(trust, "TTY", "/nonexistent/tty")
    cfg, proj, marks = _mcp_json_server(tmp_path, where)
    for i, mode in enumerate(("ask", "read-only")):
        model = script(tmp_path, sleep_call("j", f"jsn-{i}"), {"text": "done"},
                       name=f"{mode}.json")
        proc = dsh("--config", str(cfg), "run", "--mode", mode, "-m", model, "go", cwd=proj)
        assert proc.returncode == 0, proc.stderr
        assert "not trusted" not in proc.stderr
        assert "mcp__j__sleep" in json.dumps(ledger_events(tmp_path))  # the tool is there
        assert not ran(marks, f"jsn-{i}")
        assert results(tmp_path)[-1]["status"] == "error"
        decision = decisions(tmp_path)[-1]
        assert decision["allowed"] is False and decision["action"] != "read"
        assert decision["by"] == ("no-terminal" if mode == "ask" else "mode")
