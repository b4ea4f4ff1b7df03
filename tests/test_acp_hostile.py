"""``dsh acp`` against a hostile or broken client, over raw JSON lines: malformed JSON, an
oversized line, values that are not JSON-RPC, unknown methods, a wrong protocol version, a
prompt before any session, two prompts at once, a permission question never answered, a
disconnect in the middle of a turn, a cwd outside the allowed roots and client-supplied MCP
servers. The process never crashes and stdout carries only protocol."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_acp")
pytest.importorskip("dsh_shell")

from tests.acp_helpers import config  # noqa: E402
from tests.acp_helpers import env  # noqa: E402
from tests.acp_helpers import workspace  # noqa: E402
from tests.acp_helpers import write_call as _write  # noqa: E402

WAIT = 60


class Peer:
    """``dsh acp`` in a child; every stdout line must be a JSON-RPC message."""

    def __init__(self, cfg: Path, *args: str, cwd: Path, stderr: Path) -> None:
        self.err = open(stderr, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dsh", "--config", str(cfg), "acp", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, cwd=cwd,
            env=env(), start_new_session=True)
        self.lines: queue.Queue[Any] = queue.Queue()
        self.backlog: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.next_id = 100

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))  # not JSON: the test fails on a None below
        self.lines.put(None)

    def raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, obj: dict[str, Any]) -> None:
        self.raw(json.dumps(obj).encode() + b"\n")

    def request(self, method: str, params: Any = None) -> int:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        return self.next_id

    def wait(self, test: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        for i, msg in enumerate(self.backlog):
            if test(msg):
                return self.backlog.pop(i)
        while True:
            msg = self.lines.get(timeout=WAIT)
            assert msg is not None, "dsh acp closed stdout"
            if test(msg):
                return msg
            self.backlog.append(msg)

    def answer(self, id_: int) -> dict[str, Any]:
        return self.wait(lambda m: m.get("id") == id_ and "method" not in m)

    def call(self, method: str, params: Any = None) -> dict[str, Any]:
        return self.answer(self.request(method, params))

    def new_session(self, cwd: Path) -> str:
        self.call("initialize", {"protocolVersion": 1})
        reply = self.call("session/new", {"cwd": str(cwd), "mcpServers": []})
        return str(reply["result"]["sessionId"])

    def prompt(self, sid: str, text: str) -> int:
        return self.request("session/prompt", {"sessionId": sid,
                                               "prompt": [{"type": "text", "text": text}]})

    def close(self) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=WAIT)
        finally:
            self.reader.join(WAIT)
            assert self.proc.stdout is not None and self.proc.stdin is not None
            self.proc.stdout.close()
            self.proc.stdin.close()
            self.err.close()


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return workspace(tmp_path)


def test_garbage_on_the_wire_is_answered_and_never_ends_the_connection(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script({"text": "hello"}))
    peer = Peer(cfg, "--max-line", "4096", cwd=ws, stderr=tmp_path / "err.txt")
    peer.raw(b"{this is not json\n")
    assert peer.wait(lambda m: "error" in m)["error"]["code"] == -32700
    peer.raw(b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"x": "'
             + b"A" * 20000 + b'"}}\n')
    err = peer.wait(lambda m: "error" in m)
    assert (err["id"], err["error"]["code"]) == (None, -32600)
    assert "4096" in err["error"]["message"]
    for junk in (b"[1, 2]\n", b"5\n", b'"text"\n', b"null\n"):
        peer.raw(junk)
        assert peer.wait(lambda m: "error" in m)["error"]["code"] == -32600
    peer.send({"jsonrpc": "2.0", "id": 7, "method": 42})
    assert peer.answer(7)["error"]["code"] == -32600
    assert peer.call("no/such/method", {})["error"]["code"] == -32601
    # an unsupported protocol version is answered with the one dsh speaks
    init = peer.call("initialize", {"protocolVersion": 99})
    assert init["result"]["protocolVersion"] == 1
    assert init["result"]["agentCapabilities"]["loadSession"] is True
    # a prompt before any session, to an unknown one
    early = peer.call("session/prompt", {"sessionId": "nope",
                                         "prompt": [{"type": "text", "text": "hi"}]})
    assert early["error"]["code"] == -32602 and "unknown session" in early["error"]["message"]
    bad = peer.call("session/prompt", {"sessionId": 5})
    assert bad["error"]["code"] == -32602
    # a session id that names another file
    load = peer.call("session/load", {"cwd": str(ws), "sessionId": "../../etc/passwd",
                                      "mcpServers": []})
    assert "invalid session id" in load["error"]["message"]
    # still alive and working
    sid = peer.new_session(ws)
    done = peer.answer(peer.prompt(sid, "hi"))
    assert done["result"]["stopReason"] == "end_turn"
    image = peer.call("session/prompt", {"sessionId": sid, "prompt": [
        {"type": "image", "data": "AAAA", "mimeType": "image/png"}]})
    assert "image" in image["error"]["message"]
    assert peer.close() == 0
    assert "Traceback" not in (tmp_path / "err.txt").read_text()


def test_cwd_must_be_an_allowed_existing_absolute_directory(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cfg = config(tmp_path, ws, script({"text": "hello"}))
    peer = Peer(cfg, "--root", str(other), cwd=ws, stderr=tmp_path / "err.txt")
    peer.call("initialize", {"protocolVersion": 1})
    for cwd, words in ((str(elsewhere), "outside"), ("ws", "absolute"),
                       (str(ws / "missing"), "not an existing directory"),
                       (str(ws / ".." / "elsewhere"), "outside")):
        reply = peer.call("session/new", {"cwd": cwd, "mcpServers": []})
        assert reply["error"]["code"] == -32602 and words in reply["error"]["message"], reply
    link = ws / "link"
    link.symlink_to(elsewhere)
    assert "outside" in peer.call("session/new", {"cwd": str(link), "mcpServers": []}
                                  )["error"]["message"]
    for ok in (ws, ws.parent / "other"):
        assert "sessionId" in peer.call("session/new", {"cwd": str(ok), "mcpServers": []}
                                        )["result"]
    assert peer.close() == 0


def test_client_mcp_servers_are_refused_and_never_started(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    marker = tmp_path / "pwned"
    cfg = config(tmp_path, ws, script({"text": "hello"}))
    peer = Peer(cfg, cwd=ws, stderr=tmp_path / "err.txt")
    peer.call("initialize", {"protocolVersion": 1})
    reply = peer.call("session/new", {"cwd": str(ws), "mcpServers": [
        {"name": "evil", "command": "/bin/sh", "args": ["-c", f"touch {marker}"], "env": []},
        {"type": "http", "name": "remote", "url": "http://127.0.0.1:9/", "headers": []}]})
    meta = reply["result"]["_meta"]["dsh"]
    assert meta["refusedMcpServers"] == ["evil", "remote"]
    sid = reply["result"]["sessionId"]
    assert peer.answer(peer.prompt(sid, "hi"))["result"]["stopReason"] == "end_turn"
    assert peer.close() == 0
    assert not marker.exists()
    assert "evil" in (tmp_path / "err.txt").read_text()


def test_two_prompts_at_once_and_a_question_never_answered(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script(_write("notes.txt", "theirs\n"), {"text": "gave up"}))
    peer = Peer(cfg, "--permission-timeout", "1", cwd=ws, stderr=tmp_path / "err.txt")
    sid = peer.new_session(ws)
    first = peer.prompt(sid, "write it")
    asked = peer.wait(lambda m: m.get("method") == "session/request_permission")
    assert asked["params"]["sessionId"] == sid
    second = peer.answer(peer.prompt(sid, "and this"))
    assert second["error"]["code"] == -32600 and "already running" in second["error"]["message"]
    # never answered: after --permission-timeout it is a no, and the turn goes on
    done = peer.answer(first)
    assert done["result"]["stopReason"] == "end_turn"
    assert (ws / "notes.txt").read_text() == "mine\n"
    assert peer.close() == 0
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    [decision] = [e["data"] for e in events if e["type"] == "x/dsh.tools/approval"]
    assert not decision["allowed"] and "within 1 s" in decision["why"]


def test_a_cancelled_question_or_a_made_up_answer_is_a_no(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script(_write("notes.txt", "theirs\n"), {"text": "ok"},
                                      _write("notes.txt", "theirs\n"), {"text": "ok"}))
    peer = Peer(cfg, cwd=ws, stderr=tmp_path / "err.txt")
    sid = peer.new_session(ws)
    first = peer.prompt(sid, "write it")
    asked = peer.wait(lambda m: m.get("method") == "session/request_permission")
    peer.send({"jsonrpc": "2.0", "id": asked["id"],
               "result": {"outcome": {"outcome": "cancelled"}}})
    assert peer.answer(first)["result"]["stopReason"] == "end_turn"
    assert (ws / "notes.txt").read_text() == "mine\n"
    second = peer.prompt(sid, "write it again")
    asked = peer.wait(lambda m: m.get("method") == "session/request_permission")
    peer.send({"jsonrpc": "2.0", "id": asked["id"],
               "result": {"outcome": {"outcome": "selected", "optionId": "allow-everything"}}})
    assert peer.answer(second)["result"]["stopReason"] == "end_turn"
    assert (ws / "notes.txt").read_text() == "mine\n"
    assert peer.close() == 0


def test_disconnect_mid_run_aborts_and_the_session_loads_again(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script(_write("notes.txt", "theirs\n"), {"text": "later"}))
    err = tmp_path / "err.txt"
    peer = Peer(cfg, cwd=ws, stderr=err)
    sid = peer.new_session(ws)
    peer.prompt(sid, "write it")
    peer.wait(lambda m: m.get("method") == "session/request_permission")  # mid-run
    assert peer.close() == 0  # stdin closed: the run is aborted, dsh exits cleanly
    assert (ws / "notes.txt").read_text() == "mine\n"
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    [end] = [e for e in map(json.loads, ledger.read_text().splitlines())
             if e["type"] == "turn/end"]
    assert (end["outcome"], end["reason"]) == ("aborted", "run aborted: the editor disconnected")
    shown = subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), "sessions",
                            "show", sid], capture_output=True, text=True, env=env(),
                           timeout=WAIT, stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr
    assert "write it" in shown.stdout
    again = Peer(cfg, cwd=ws, stderr=err)
    again.call("initialize", {"protocolVersion": 1})
    loaded = again.call("session/load", {"cwd": str(ws), "sessionId": sid, "mcpServers": []})
    assert "result" in loaded, loaded
    users = [m["params"]["update"] for m in again.backlog
             if m.get("method") == "session/update"
             and m["params"]["update"]["sessionUpdate"] == "user_message_chunk"]
    assert [u["content"]["text"] for u in users] == ["write it"]
    assert again.close() == 0
    assert "Traceback" not in err.read_text()


def test_requests_sent_before_the_end_of_input_are_answered(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    """``printf … | dsh acp``: stdin ends at once; every request still gets its answer (a
    prompt that comes after the end is ``cancelled``), and stdout holds only those."""
    cfg = config(tmp_path, ws, script({"text": "hello"}))
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": 1}},
             {"jsonrpc": "2.0", "id": 2, "method": "session/new",
              "params": {"cwd": str(ws), "mcpServers": []}},
             {"jsonrpc": "2.0", "id": 3, "method": "session/list", "params": {}}]
    done = subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), "acp"],
                          input="".join(json.dumps(m) + "\n" for m in lines), text=True,
                          capture_output=True, cwd=ws, env=env(), timeout=WAIT)
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert sorted(a["id"] for a in answers) == [1, 2, 3]
    assert all("result" in a for a in answers), answers
    assert done.stderr == ""


def test_sigterm_aborts_the_turn_answers_and_exits_143(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script(_write("notes.txt", "theirs\n"), {"text": "later"}))
    peer = Peer(cfg, cwd=ws, stderr=tmp_path / "err.txt")
    sid = peer.new_session(ws)
    first = peer.prompt(sid, "write it")
    peer.wait(lambda m: m.get("method") == "session/request_permission")
    peer.proc.send_signal(signal.SIGTERM)
    assert peer.answer(first)["result"]["stopReason"] == "cancelled"
    assert peer.close() == 143
    assert (ws / "notes.txt").read_text() == "mine\n"
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    [end] = [e for e in map(json.loads, ledger.read_text().splitlines())
             if e["type"] == "turn/end"]
    assert end["outcome"] == "aborted"


def test_an_embedded_resource_is_sent_as_a_block(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script({"text": "seen"}))
    peer = Peer(cfg, cwd=ws, stderr=tmp_path / "err.txt")
    sid = peer.new_session(ws)
    reply = peer.call("session/prompt", {"sessionId": sid, "prompt": [
        {"type": "text", "text": "look at this"},
        {"type": "resource", "resource": {"uri": "file:///src/x.py", "text": "print(1)"}},
        {"type": "resource_link", "uri": "file:///src/y.py", "name": "y.py"}]})
    assert reply["result"]["stopReason"] == "end_turn"
    assert peer.close() == 0
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    [user] = [e for e in map(json.loads, ledger.read_text().splitlines())
              if e["type"] == "user/message"]
    assert user["text"] == ('look at this\n\n<resource uri="file:///src/x.py">\nprint(1)\n'
                            '</resource>\n\n[y.py](file:///src/y.py)')
