"""``dsh mcp serve`` against hostile input: a web page's Origin, a rebound Host, a remote
--host, unknown agents and sessions, oversized and malformed requests, and a server started
with a controlling terminal (no approval question may ever be written to it)."""

from __future__ import annotations

import http.client
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_mcp")
pytest.importorskip("dsh_shell")
anyio = pytest.importorskip("anyio")
from mcp import ClientSession  # noqa: E402
from mcp import StdioServerParameters  # noqa: E402
from mcp import stdio_client  # noqa: E402

from tests.test_mcp_serve import TIMEOUT  # noqa: E402
from tests.test_mcp_serve import WRITE  # noqa: E402
from tests.test_mcp_serve import config  # noqa: E402
from tests.test_mcp_serve import dsh  # noqa: E402
from tests.test_mcp_serve import env  # noqa: E402
from tests.test_mcp_serve import http_client  # noqa: E402
from tests.test_mcp_serve import http_server  # noqa: E402
from tests.test_mcp_serve import stdio  # noqa: E402

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "probe", "version": "1"}}}
RUN = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
       "params": {"name": "run", "arguments": {"prompt": "write the notes"}}}


def post(url: str, body: bytes, **headers: str) -> tuple[int, str]:
    """One POST to the server with exactly these headers (``Host`` too, when given)."""
    parts = url.split("/")
    host, port = parts[2].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        conn.request("POST", "/mcp", body=body, headers={
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", **headers})
        response = conn.getresponse()
        return response.status, response.read(2000).decode("utf-8", "replace")
    finally:
        conn.close()


def sessions(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "sessions").glob("*.jsonl"))


def test_a_foreign_origin_or_host_is_refused_and_nothing_runs(
        tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script(WRITE, {"text": "done"}))
    with http_server(cfg, "--mode", "auto-edit") as (url, proc):
        port = url.split(":")[2].split("/")[0]
        init, run = json.dumps(INITIALIZE).encode(), json.dumps(RUN).encode()
        for body in (init, run):
            for origin in ("http://evil.example", "https://attacker.test:443", "null",
                           f"http://127.0.0.1.evil.example:{port}",
                           f"http://localhost:{port}@evil.example", "file://",
                           f"http://localhost:{port}/path"):
                status, text = post(url, body, Origin=origin)
                assert status == 403, (origin, status, text)
            for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{int(port) + 1}",
                         f"localhost.evil.example:{port}"):
                status, text = post(url, body, Host=host)
                assert status == 421, (host, status, text)
        assert sessions(tmp_path) == []  # nothing ran
        assert (tmp_path / "ws" / "notes.txt").read_text() == "mine\n"
        # loopback origins (a local web UI) and the server's own names are served
        assert post(url, init, Origin="http://localhost:6274")[0] == 200
        assert post(url, init, Host=f"localhost:{port}")[0] == 200

        async def main() -> Any:
            async with http_client(url) as client:
                return await client.call_tool("run", {"prompt": "write the notes"})

        result = anyio.run(main)
        assert proc.poll() is None
    assert not result.is_error and len(sessions(tmp_path)) == 1
    assert (tmp_path / "ws" / "notes.txt").read_text() == "changed"


def test_oversized_and_malformed_http_requests_do_not_kill_the_server(
        tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script({"text": "still here"}))
    with http_server(cfg) as (url, proc):
        assert post(url, b"x" * (5 << 20))[0] == 413
        status, text = post(url, b"{not json")
        assert status == 400 and "Parse error" in text
        assert post(url, b"[1, 2, 3]")[0] >= 400
        assert post(url, b"\xff\xfe\x00garbage")[0] >= 400
        assert post(url, json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                     "params": {"name": "run"}}).encode())[0] >= 400

        async def main() -> Any:
            async with http_client(url) as client:
                return await client.call_tool("run", {"prompt": "hello"})

        result = anyio.run(main)
        assert proc.poll() is None
    assert result.structured_content["output"] == "still here"


@pytest.mark.parametrize("args, said", [
    (["--http", "--host", "0.0.0.0"], "not a loopback address"),
    (["--http", "--host", "192.0.2.7"], "not a loopback address"),
    (["--http", "--host", "example.com"], "not a loopback address"),
    (["--http", "--host", "::"], "not a loopback address"),
    (["--host", "127.0.0.1"], "go with --http"),
    (["--port", "9"], "go with --http"),
    (["--agent", "nobody"], "'nobody': no such agent (configured: default, helper)"),
    (["--mode", "yolo"], "not a permission mode"),
])
def test_options_that_are_refused(tmp_path: Path, script: Callable[..., str],
                                  args: list[str], said: str) -> None:
    proc = dsh(config(tmp_path, script({"text": "x"})), "mcp", "serve", *args)
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and proc.stdout == ""


def test_unknown_agents_sessions_and_arguments_are_tool_errors(
        tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script({"text": "one"}, {"text": "two"}, {"text": "three"}),
                 "[limits]\nrequests = 1\n")
    budget = script(WRITE, {"text": "never"})
    cfg.write_text(cfg.read_text() + f'[agents.costly]\nmodel = {json.dumps(budget)}\n')

    async def main() -> dict[str, Any]:
        async with stdio(cfg, "--agent", "default", "--agent", "costly") as client:
            out: dict[str, Any] = {}
            out["agent"] = await client.call_tool("run", {"prompt": "x", "agent": "helper"})
            out["odd agent"] = await client.call_tool("run", {"prompt": "x",
                                                              "agent": "\x1b[2Jevil"})
            for name, session in (("none", "20260101-000000.000-abcdef"),
                                  ("path", "../../../etc/passwd"), ("long", "a" * 5000)):
                out[f"resume {name}"] = await client.call_tool(
                    "resume", {"session": session, "prompt": "x"})
                out[f"fork {name}"] = await client.call_tool("fork", {"session": session})
            out["empty prompt"] = await client.call_tool("run", {"prompt": ""})
            out["typed"] = await client.call_tool("run", {"prompt": ["not", "text"]})
            out["extra"] = await client.call_tool("run", {"prompt": "x", "sudo": True})
            out["missing"] = await client.call_tool("resume", {"prompt": "x"})
            out["words"] = await client.call_tool("search", {"text": "?!"})
            out["budget"] = await client.call_tool("run", {"prompt": "x", "agent": "costly"})
            ok = await client.call_tool("run", {"prompt": "fine"})
            out["ok"] = ok
            sid = ok.structured_content["session"]
            out["fork past"] = await client.call_tool("fork", {"session": sid, "at": 7})
            out["tool"] = None
            try:
                await client.call_tool("rm_rf", {})
            except Exception as exc:  # noqa: BLE001 - a protocol error, said by the SDK
                out["tool"] = str(exc)
            return out

    out = anyio.run(main)

    def text(key: str) -> str:
        assert out[key].is_error, (key, out[key])
        return str(out[key].content[0].text)

    assert "unknown agent 'helper': this server runs default, costly" in text("agent")
    assert "\x1b" not in text("odd agent") and "\\x1b" in text("odd agent")
    assert "no session '20260101-000000.000-abcdef'" in text("resume none")
    for key in ("resume none", "fork none", "resume path", "fork path", "resume long",
                "fork long"):
        assert "session" in text(key), key
        assert len(text(key)) < 2000
    assert not (tmp_path / "sessions" / "passwd.jsonl").exists()
    assert "prompt" in text("empty prompt") and "invalid arguments" in text("typed")
    assert "'sudo' was unexpected" in text("extra")
    assert "'session' is a required property" in text("missing")
    assert "no words" in text("words")
    assert "budget" in text("budget") and out["budget"].structured_content["outcome"] == "budget"
    assert not out["ok"].is_error
    assert "there is no turn 7" in text("fork past")
    assert out["tool"] is not None and "rm_rf" in out["tool"]


def _rpc(proc: subprocess.Popen[bytes], message: Any) -> None:
    assert proc.stdin is not None
    data = message if isinstance(message, bytes) else json.dumps(message).encode()
    proc.stdin.write(data + b"\n")
    proc.stdin.flush()


def _answer(proc: subprocess.Popen[bytes], wanted: int, lines: list[bytes]) -> dict[str, Any]:
    """Read stdout lines (each must be a JSON-RPC message) until the answer to ``wanted``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if not select.select([proc.stdout], [], [], 1)[0]:
            continue
        line = proc.stdout.readline()
        assert line, "the server closed its stdout"
        lines.append(line)
        message = json.loads(line)
        assert message["jsonrpc"] == "2.0"
        if message.get("id") == wanted:
            return dict(message)
    raise AssertionError(f"no answer to request {wanted}")


def test_malformed_stdio_lines_do_not_kill_the_server_and_stdout_is_only_protocol(
        tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script({"text": "answered"}))
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "mcp", "serve"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
    lines: list[bytes] = []
    try:
        _rpc(proc, b"this is not json")
        _rpc(proc, b"\xff\xfe not utf-8")
        _rpc(proc, b'{"jsonrpc": "2.0", "id": 99, "method": 5}')
        _rpc(proc, INITIALIZE)
        assert _answer(proc, 1, lines)["result"]["serverInfo"]["name"] == "dsh"
        _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _rpc(proc, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                    "params": {"name": "run", "arguments": "not an object"}})
        assert "error" in _answer(proc, 3, lines)
        _rpc(proc, {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                    "params": {"name": "run", "arguments": {"prompt": "p" * 300_000}}})
        big = _answer(proc, 4, lines)["result"]
        assert not big["isError"] and big["structuredContent"]["output"] == "answered"
        _rpc(proc, {"jsonrpc": "2.0", "id": 5, "method": "tools/list"})
        assert len(_answer(proc, 5, lines)["result"]["tools"]) == 4
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            rest = proc.stdout.read()
            proc.stdout.close()
            lines.extend(rest.splitlines(keepends=True))
    for line in lines:  # only protocol on stdout: no work line, no status line
        assert json.loads(line)["jsonrpc"] == "2.0"


LAUNCHER = """
import fcntl, os, sys, termios
slave, marker = sys.argv[1], sys.argv[2]
try:
    os.setsid()
except OSError:
    pass  # already a session leader (the SDK's client starts a new session)
fd = os.open(slave, os.O_RDWR)  # the first terminal a session leader opens is its own
fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
os.close(fd)
tty = os.open("/dev/tty", os.O_RDWR)  # the controlling terminal, as the approval asks on
with open(marker, "w") as out:
    # tty_nr of /proc/self/stat: the controlling terminal's device number
    out.write(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[4])
os.close(tty)
os.execv(sys.executable, [sys.executable, *sys.argv[3:]])
"""


PLAN = {"tool_calls": [{"name": "propose_plan", "arguments": {"plan": "1. write notes"}}]}


@pytest.mark.parametrize("mode, first, refused", [
    ("ask", WRITE, ("write_file", "no-one")),
    ("plan", PLAN, ("propose_plan", "no-one")),
])
def test_no_question_is_ever_asked_on_a_controlling_terminal(
        tmp_path: Path, script: Callable[..., str], mode: str, first: dict[str, Any],
        refused: tuple[str, str]) -> None:
    """A stdio server started from a terminal (an editor's integrated one) has a controlling
    terminal: nothing may ask on it — not the approval service (the write is refused), not
    plan mode (no one can approve the plan: the model answers with it)."""
    import pty

    cfg = config(tmp_path, script(first, {"text": "asked no one"}))
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    marker = tmp_path / "tty"
    master, slave = pty.openpty()
    slave_name = os.ttyname(slave)
    params = StdioServerParameters(
        command=sys.executable,
        args=[str(launcher), slave_name, str(marker), "-m", "dsh", "--config", str(cfg), "mcp",
              "serve", "--mode", mode], env=env())

    async def main() -> Any:
        with (tmp_path / "stderr.txt").open("w") as err, anyio.fail_after(TIMEOUT):
            async with stdio_client(params, errlog=err) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("run", {"prompt": "write the notes"})

    try:
        result = anyio.run(main)
        # the server did have that terminal as its own
        assert marker.read_text() == str(os.stat(slave_name).st_rdev)
        written = b""
        while select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            written += chunk
    finally:
        os.close(master)
        os.close(slave)
    assert written == b""  # not one byte: no question, no status line
    assert not result.is_error and result.structured_content["output"] == "asked no one"
    assert (tmp_path / "ws" / "notes.txt").read_text() == "mine\n"
    events = [json.loads(line) for line in (
        tmp_path / "sessions" / f"{result.structured_content['session']}.jsonl"
    ).read_text().splitlines()]
    [decision] = [e["data"] for e in events if e["type"] == "x/dsh.tools/approval"]
    assert (decision["tool"], decision["by"]) == refused and not decision["allowed"]


def test_sessions_of_agents_the_server_does_not_run_are_out_of_reach(
        tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script({"text": "the helper's secret plan"}, {"text": "more"}))

    async def main() -> tuple[Any, ...]:
        async with stdio(cfg, "--agent", "helper") as client:
            made = await client.call_tool("run", {"prompt": "secret plan"})
        sid = made.structured_content["session"]
        async with stdio(cfg) as client:  # the config's agent only
            return (sid, await client.call_tool("resume", {"session": sid, "prompt": "x"}),
                    await client.call_tool("fork", {"session": sid}),
                    await client.call_tool("search", {"text": "secret plan"}),
                    await client.call_tool("resume", {"session": "latest", "prompt": "x"}))

    sid, resumed, forked, found, latest = anyio.run(main)
    assert latest.is_error and "resume: no sessions yet of default" in latest.content[0].text
    for result in (resumed, forked):
        assert result.is_error
        assert f"session {sid} belongs to agent 'helper'" in result.content[0].text
        assert "it runs default" in result.content[0].text
    assert found.structured_content == {"sessions": []}
    assert len(sessions(tmp_path)) == 1  # no fork was made
