"""``dsh mcp serve`` under attack: header tricks on the loopback HTTP port (a missing or
look-alike Host, odd Origins, other methods), integer arguments sent as floats, session
prefixes that reach another agent's sessions, two turns on one session at once, terminal
escapes in what the model says, and cancellations of calls that are done or unknown."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_mcp")
pytest.importorskip("dsh_shell")
anyio = pytest.importorskip("anyio")

from tests.test_mcp_serve import TIMEOUT  # noqa: E402
from tests.test_mcp_serve import WRITE  # noqa: E402
from tests.test_mcp_serve import Progress  # noqa: E402
from tests.test_mcp_serve import config  # noqa: E402
from tests.test_mcp_serve import http_server  # noqa: E402
from tests.test_mcp_serve import ledger  # noqa: E402
from tests.test_mcp_serve import stdio  # noqa: E402
from tests.test_mcp_serve_hostile import INITIALIZE  # noqa: E402
from tests.test_mcp_serve_hostile import RUN  # noqa: E402
from tests.test_mcp_serve_hostile import sessions  # noqa: E402


def raw(port: int, head: str, body: bytes = b"") -> int:
    """Send exactly ``head`` (request line and headers, ``\\r\\n``-separated, no blank line)
    and ``body``; the response's status code."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as conn:
        conn.sendall(head.encode("latin-1") + f"\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        data = b""
        while b"\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


def test_look_alike_hosts_odd_origins_and_other_methods_are_refused(
        tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script(WRITE, {"text": "done"}))
    with http_server(cfg, "--mode", "auto-edit") as (url, proc):
        port = int(url.split(":")[2].split("/")[0])
        accept = "Content-Type: application/json\r\nAccept: application/json, text/event-stream"
        for body in (json.dumps(INITIALIZE).encode(), json.dumps(RUN).encode()):
            # no Host at all (HTTP/1.0), and names that only look like the server's
            assert raw(port, f"POST /mcp HTTP/1.0\r\n{accept}", body) == 421
            for host in (f"127.0.0.1.evil.example:{port}", f"127.0.0.1:{port}.evil.example",
                         f"[::1]:{port}", f"evil@127.0.0.1:{port}", "127.0.0.1",
                         f"127.0.0.1:0{port}", ""):
                status = raw(port, f"POST /mcp HTTP/1.1\r\nHost: {host}\r\n{accept}", body)
                assert status in (400, 421), (host, status)
            two = f"Host: 127.0.0.1:{port}\r\nHost: evil.example"
            assert raw(port, f"POST /mcp HTTP/1.1\r\n{two}\r\n{accept}", body) in (400, 421)
            for origin in ("null", "NULL", "http://127.0.0.1.evil.example", "http://localhost.",
                           "http://0x7f000001", "http://127.1", "chrome-extension://abc",
                           f"http://127.0.0.1:{port}\r\nOrigin: http://evil.example",
                           f"http://evil.example\r\nOrigin: http://127.0.0.1:{port}",
                           "http://[::1]:x", "http://localhost:3000/", "//localhost"):
                head = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: {origin}"
                assert raw(port, f"{head}\r\n{accept}", body) == 403, origin
        for method in ("GET", "DELETE", "OPTIONS", "PUT"):
            head = (f"{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                    f"Origin: http://evil.example\r\n{accept}")
            assert raw(port, head) == 403, method
            assert raw(port, f"{method} /mcp HTTP/1.1\r\nHost: evil.example:{port}") == 421
        assert sessions(tmp_path) == []  # nothing ran
        assert (tmp_path / "ws" / "notes.txt").read_text() == "mine\n"
        # the real names are served
        ok = f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nOrigin: http://[::1]:6274"
        assert raw(port, f"{ok}\r\n{accept}", json.dumps(INITIALIZE).encode()) == 200
        assert proc.poll() is None


def test_integers_sent_as_floats_are_integers(tmp_path: Path,
                                              script: Callable[..., str]) -> None:
    """JSON has one number type: ``5.0`` is a valid integer by the schema, so the tools take
    it as 5, never fail with an unexpected error."""
    cfg = config(tmp_path, script({"text": "the zebra answer"}))

    async def main() -> list[Any]:
        async with stdio(cfg) as client:
            made = await client.call_tool("run", {"prompt": "zebra"})
            sid = made.structured_content["session"]
            return [sid, await client.call_tool("search", {"text": "zebra", "limit": 5.0}),
                    await client.call_tool("fork", {"session": sid, "at": 1.0}),
                    await client.call_tool("search", {"text": "zebra", "limit": 1.5})]

    sid, found, forked, half = anyio.run(main)
    assert not found.is_error, found.content[0].text
    assert [h["session"] for h in found.structured_content["sessions"]] == [sid]
    assert not forked.is_error, forked.content[0].text
    assert forked.structured_content["at"] == 1 and forked.structured_content["parent"] == sid
    assert half.is_error and "integer" in half.content[0].text
    assert "unexpected" not in (tmp_path / "serve-stderr.txt").read_text()


def test_prefixes_reach_only_the_served_agents_sessions(tmp_path: Path,
                                                        script: Callable[..., str]) -> None:
    """A prefix (or short form) that matches only another agent's session names nothing,
    and says nothing of it; one that matches a served session and another agent's picks
    the served one."""
    cfg = config(tmp_path, script({"text": "an answer"}, {"text": "continued"}))

    async def main() -> list[Any]:
        async with stdio(cfg, "--agent", "helper") as client:
            theirs = (await client.call_tool("run", {"prompt": "x"})).structured_content
        async with stdio(cfg) as client:
            mine = (await client.call_tool("run", {"prompt": "y"})).structured_content
            other, own = theirs["session"], mine["session"]
            common = os.path.commonprefix([other, own])
            assert common and common != own
            return [other, own, common,
                    await client.call_tool("fork", {"session": other[:len(common) + 1]}),
                    await client.call_tool("resume", {"session": other[-6:], "prompt": "z"}),
                    await client.call_tool("resume", {"session": common, "prompt": "z"})]

    other, own, common, by_prefix, by_short, shared = anyio.run(main)
    for result in (by_prefix, by_short):
        assert result.is_error
        text = result.content[0].text
        assert other not in text and "helper" not in text and "no session" in text
    assert not shared.is_error, shared.content[0].text
    assert shared.structured_content["session"] == own
    assert shared.structured_content["output"] == "continued"  # its history was sent
    assert len(sessions(tmp_path)) == 2  # no fork of the helper's session was made


def test_a_session_gets_one_turn_at_a_time(tmp_path: Path, script: Callable[..., str]) -> None:
    """A resume of a session whose turn is running is refused (the session is in use) and
    records nothing; the running turn is not disturbed; the server goes on serving."""
    cfg = config(tmp_path, script({"text": "first"}, {"delay": 60, "text": "slow"}))
    progress = Progress()

    async def main() -> list[Any]:
        async with stdio(cfg) as client:
            sid = (await client.call_tool("run", {"prompt": "one"})).structured_content[
                "session"]
            second: list[Any] = []
            async with anyio.create_task_group() as group:
                async def slow() -> None:
                    await client.call_tool("resume", {"session": sid, "prompt": "two"},
                                           progress_callback=progress)

                group.start_soon(slow)
                while not any(m.startswith("step 1") for m in progress.messages):
                    await anyio.sleep(0.05)
                second.append(await client.call_tool("resume", {"session": sid,
                                                                "prompt": "three"}))
                second.append(await client.call_tool("fork", {"session": "latest"}))
                group.cancel_scope.cancel()
            return [sid, *second]

    sid, busy, forked = anyio.run(main)
    assert busy.is_error and "in use" in busy.content[0].text, busy.content[0].text
    assert not forked.is_error  # reading a running session is fine
    texts = [e["text"] for e in ledger(tmp_path, sid) if e["type"] == "user/message"]
    assert texts == ["one", "two"]  # "three" never reached the ledger


def test_terminal_escapes_from_the_model_are_made_visible(tmp_path: Path,
                                                          script: Callable[..., str]) -> None:
    evil = "\x1b]0;pwned\x07\x1b[2J"
    calls = {"tool_calls": [
        {"name": "write_file", "arguments": {"path": f"n{evil}.txt", "content": evil}},
        {"name": f"no_such{evil}", "arguments": {"x": evil}}]}
    cfg = config(tmp_path, script(calls, {"text": f"answer{evil}"}))
    progress = Progress()

    async def main() -> Any:
        async with stdio(cfg, "--mode", "auto-edit") as client:
            return await client.call_tool("run", {"prompt": "go"}, progress_callback=progress)

    result = anyio.run(main)
    assert result.structured_content["output"] == f"answer{evil}"  # the answer is data
    assert any("write_file" in m for m in progress.messages)
    assert any("no_such" in m for m in progress.messages)
    for message in progress.messages:
        assert "\x1b" not in message and "\x07" not in message, message
    assert "\x1b" not in (tmp_path / "serve-stderr.txt").read_text()


def test_cancelling_done_or_unknown_calls_changes_nothing(tmp_path: Path,
                                                          script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script({"text": "a"}, {"text": "b"}))

    async def main() -> list[Any]:
        import mcp_types as types

        async with stdio(cfg) as client:
            first = await client.call_tool("run", {"prompt": "one"})
            for request in (1, 2, 3, 999, "nope"):
                await client.send_notification(types.CancelledNotification(
                    params=types.CancelledNotificationParams(request_id=request,
                                                             reason="late")))
            again = await client.call_tool("resume", {"session": "latest", "prompt": "two"})
            return [first, again]

    first, again = anyio.run(main)
    sid = first.structured_content["session"]
    assert again.structured_content == {"session": sid, "output": "b", "outcome": "completed"}
    ends = [e["outcome"] for e in ledger(tmp_path, sid) if e["type"] == "turn/end"]
    assert ends == ["completed", "completed"]


def test_a_resume_keeps_the_servers_mode_and_workspace(tmp_path: Path,
                                                       script: Callable[..., str]) -> None:
    """A session the person ran in full-auto is resumed in the server's mode (ask): the write
    its next turn tries is refused, in the server's workspace."""
    from tests.test_mcp_serve import dsh

    cfg = config(tmp_path, script({"text": "by hand"}, WRITE, {"text": "resumed"}))
    made = dsh(cfg, "run", "--mode", "full-auto", "hello")
    assert made.returncode == 0, made.stderr
    [path] = sessions(tmp_path)

    async def main() -> Any:
        async with stdio(cfg) as client:
            return await client.call_tool("resume", {"session": path.stem, "prompt": "write"})

    result = anyio.run(main)
    assert not result.is_error and result.structured_content["output"] == "resumed"
    assert (tmp_path / "ws" / "notes.txt").read_text() == "mine\n"
    [decision] = [e["data"] for e in ledger(tmp_path, path.stem)
                  if e["type"] == "x/dsh.tools/approval"]
    assert (decision["allowed"], decision["mode"], decision["by"]) == (False, "ask", "no-one")


def test_a_client_that_leaves_mid_turn_leaves_a_closed_ledger(
        tmp_path: Path, script: Callable[..., str]) -> None:
    """The client closes the server's stdin while a turn waits on the model: the turn is
    aborted and recorded as such, the process exits, and stdout held only protocol."""
    import subprocess
    import sys

    from tests.test_mcp_serve import env
    from tests.test_mcp_serve_hostile import _answer
    from tests.test_mcp_serve_hostile import _rpc

    cfg = config(tmp_path, script({"delay": 60, "text": "too late"}))
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "mcp", "serve"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env(), start_new_session=True)
    lines: list[bytes] = []
    try:
        _rpc(proc, INITIALIZE)
        _answer(proc, 1, lines)
        _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _rpc(proc, {**RUN, "params": {**RUN["params"], "_meta": {"progressToken": 7}}})
        while True:  # until the turn is waiting on the model
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, "the server closed its stdout"
            lines.append(line)
            if "step 1" in line.decode():
                break
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=TIMEOUT)  # the client left: the server ends
        assert proc.stdout is not None
        lines.extend(proc.stdout.read().splitlines(keepends=True))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    for line in lines:
        assert json.loads(line)["jsonrpc"] == "2.0"
    [path] = sessions(tmp_path)
    ends = [e for e in ledger(tmp_path, path.stem) if e["type"] == "turn/end"]
    assert [e["outcome"] for e in ends] == ["aborted"]


def test_a_session_id_with_a_lone_surrogate_names_no_session(
        tmp_path: Path, script: Callable[..., str]) -> None:
    """``"\\udcff"`` (a lone surrogate) is refused by the SDK's JSON parser as invalid
    JSON, so that request is never a call; the server goes on answering, and the session
    index stays in use (no warning that it was given up). The service itself refuses such
    an id before any lookup (``Service._session``), for transports that do pass it."""
    import subprocess
    import sys

    from tests.test_mcp_serve import env
    from tests.test_mcp_serve_hostile import _answer
    from tests.test_mcp_serve_hostile import _rpc

    cfg = config(tmp_path, script({"text": "a"}, {"text": "b"}))
    err = tmp_path / "stderr.txt"
    with err.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(cfg), "mcp",
                                 "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=log, env=env(), start_new_session=True)
        lines: list[bytes] = []
        try:
            _rpc(proc, INITIALIZE)
            _answer(proc, 1, lines)
            _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            _rpc(proc, RUN)
            assert not _answer(proc, 2, lines)["result"]["isError"]
            call = ('{"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": '
                    '"resume", "arguments": {"session": "\\udcff", "prompt": "x"}}}')
            _rpc(proc, call.encode())
            _rpc(proc, {"jsonrpc": "2.0", "id": 11, "method": "tools/list"})
            assert _answer(proc, 11, lines)["result"]["tools"]
            assert not any(json.loads(line).get("id") == 10 for line in lines)
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=TIMEOUT)
            if proc.stdout is not None:
                proc.stdout.close()
    assert "index not used" not in err.read_text()
    assert len(sessions(tmp_path)) == 1
