"""``dsh acp`` against an attacker's or a clumsy client, over the ACP Python SDK's own client:
an editor that disconnects while a permission question is open; terminal escapes and bidi
controls in the model's text and in tool names and arguments; a ``session/cancel`` that
arrives as the turn ends; a ``session/set_mode`` sent while a turn runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_acp")
pytest.importorskip("dsh_shell")

from acp import schema  # noqa: E402
from acp import text_block  # noqa: E402

from tests.acp_helpers import Client  # noqa: E402
from tests.acp_helpers import config  # noqa: E402
from tests.acp_helpers import env  # noqa: E402
from tests.acp_helpers import initialized  # noqa: E402
from tests.acp_helpers import run  # noqa: E402
from tests.acp_helpers import spawn  # noqa: E402
from tests.acp_helpers import workspace  # noqa: E402
from tests.acp_helpers import write_call as _write  # noqa: E402

WAIT = 60
#: Erase the screen, set the clipboard (OSC 52), flip the text's direction (U+202E).
HOSTILE = "\x1b[2J\x1b]52;c;cHduZWQ=\x07\u202eevil"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return workspace(tmp_path)


class _Asked(Client):
    """Never answers; sets ``asked_event`` once the question is in."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = None
        self.asked_event = asyncio.Event()

    async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                 **kwargs: Any) -> schema.RequestPermissionResponse:
        self.asked_event.set()
        return await super().request_permission(options, session_id, tool_call, **kwargs)


def test_a_disconnect_while_a_question_is_open_exits_and_the_session_loads(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script(_write("notes.txt", "theirs\n"), {"text": "later"}))
    err = tmp_path / "err.txt"

    async def go() -> tuple[str, int | None]:
        client = _Asked()
        async with spawn(cfg, cwd=ws, stderr=err, client=client) as (conn, proc, _c):
            await initialized(conn)
            new = await conn.new_session(cwd=str(ws), mcp_servers=[])
            turn = asyncio.ensure_future(conn.prompt(session_id=new.session_id,
                                                     prompt=[text_block("write it")]))
            await asyncio.wait_for(client.asked_event.wait(), WAIT)
            proc.stdin.close()  # the editor is gone, its question unanswered
            code = await asyncio.wait_for(proc.wait(), WAIT)
            # the open prompt was answered before the agent went
            assert (await asyncio.wait_for(turn, WAIT)).stop_reason == "cancelled"
            return str(new.session_id), code

    sid, code = run(go)
    assert code == 0
    assert (ws / "notes.txt").read_text() == "mine\n"
    shown = subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), "sessions",
                            "show", sid], capture_output=True, text=True, env=env(),
                           timeout=WAIT, stdin=subprocess.DEVNULL)
    assert shown.returncode == 0, shown.stderr
    assert "write it" in shown.stdout
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    [end] = [e for e in map(json.loads, ledger.read_text().splitlines())
             if e["type"] == "turn/end"]
    assert end["outcome"] == "aborted", end

    async def again() -> None:
        async with spawn(cfg, cwd=ws, stderr=err) as (conn, _p, client):
            await initialized(conn)
            await conn.load_session(cwd=str(ws), session_id=sid, mcp_servers=[])
            assert client.text("user_message_chunk") == "write it"

    run(again)
    assert "Traceback" not in err.read_text()


def test_terminal_escapes_are_data_on_the_wire_and_never_raw_on_stderr(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script(
        {"text": "look " + HOSTILE},
        {"tool_calls": [{"name": "read_file" + HOSTILE, "arguments": {"path": HOSTILE}},
                        {"name": "read_file", "arguments": {"path": "x" + HOSTILE}}]},
        {"text": "end " + HOSTILE}))
    err = tmp_path / "err.txt"

    async def go() -> Client:
        async with spawn(cfg, "--mode", "full-auto", cwd=ws,
                         stderr=err) as (conn, _p, client):
            await initialized(conn)
            # what dsh names on stderr: an unknown notification, a refused MCP server
            # (an unknown method not starting with "_", which the SDK's public calls only
            # send as extensions: through its connection's own send_notification)
            await conn._conn.send_notification("dsh/nothing" + HOSTILE, {"x": HOSTILE})
            server = schema.McpServerStdio(name="mcp" + HOSTILE, command="/bin/true",
                                           args=[], env=[])
            new = await conn.new_session(cwd=str(ws), mcp_servers=[server])
            first = await conn.prompt(session_id=new.session_id, prompt=[text_block("hi")])
            assert first.stop_reason == "end_turn"
            second = await conn.prompt(session_id=new.session_id,
                                       prompt=[text_block(HOSTILE)])
            assert second.stop_reason == "end_turn"
            return client

    client = run(go)
    assert client.text().startswith("look " + HOSTILE)
    assert client.text().endswith("end " + HOSTILE)
    wire = json.dumps([u.model_dump(mode="json") for _, u in client.updates])
    assert json.dumps(HOSTILE)[1:-1] in wire  # the tool calls carry them too, as data
    raw = err.read_bytes()
    assert b"\x1b" not in raw and b"\x07" not in raw
    assert "\u202e".encode() not in raw
    shown = raw.decode()
    assert "mcp\\x1b[2J" in shown and "dsh/nothing\\x1b[2J" in shown, shown
    assert "Traceback" not in shown


class _CancelAtEnd(Client):
    """Sends ``session/cancel`` the moment the final chunk of the first turn arrives."""

    def __init__(self, last: str) -> None:
        super().__init__()
        self.last = last
        self.conn: Any = None
        self.sent = asyncio.Event()
        self.done: list[str] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        await super().session_update(session_id, update, **kwargs)
        if (not self.done and update.session_update == "agent_message_chunk"
                and self.last in self.text()):
            self.done.append(session_id)
            await self.conn.cancel(session_id=session_id)
            self.sent.set()


def test_a_cancel_as_the_turn_ends_answers_once_and_the_next_prompt_works(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script({"text": "first answer"}, {"text": "second answer"}))
    err = tmp_path / "err.txt"

    async def go() -> None:
        client = _CancelAtEnd("first answer")
        async with spawn(cfg, cwd=ws, stderr=err, client=client) as (conn, _p, _c):
            client.conn = conn
            await initialized(conn)
            new = await conn.new_session(cwd=str(ws), mcp_servers=[])
            first = await conn.prompt(session_id=new.session_id, prompt=[text_block("one")])
            assert first.stop_reason in ("end_turn", "cancelled")
            await asyncio.wait_for(client.sent.wait(), WAIT)
            second = await conn.prompt(session_id=new.session_id, prompt=[text_block("two")])
            assert second.stop_reason == "end_turn"
            assert client.text().endswith("second answer")

    run(go)
    [ledger] = (tmp_path / "sessions").glob("*.jsonl")
    ends = [e for e in map(json.loads, ledger.read_text().splitlines())
            if e["type"] == "turn/end"]
    assert len(ends) == 2 and ends[1]["outcome"] == "completed", ends
    assert "Traceback" not in err.read_text()


class _SwitchWhileAsked(Client):
    """While the first question is open, switches the session to read-only, then allows."""

    def __init__(self) -> None:
        super().__init__()
        self.conn: Any = None
        self.switched: list[str] = []

    async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                 **kwargs: Any) -> schema.RequestPermissionResponse:
        if not self.switched:
            await self.conn.set_session_mode(session_id=session_id, mode_id="read-only")
            self.switched.append(session_id)
        return await super().request_permission(options, session_id, tool_call, **kwargs)


def test_set_mode_during_a_turn_applies_from_the_next_prompt(
        tmp_path: Path, ws: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, ws, script(
        _write("notes.txt", "allowed\n"), {"text": "wrote"},
        _write("other.txt", "refused\n"), {"text": "could not"}))
    err = tmp_path / "err.txt"

    async def go() -> None:
        client = _SwitchWhileAsked()
        async with spawn(cfg, "--mode", "ask", cwd=ws, stderr=err,
                         client=client) as (conn, _p, _c):
            client.conn = conn
            await initialized(conn)
            new = await conn.new_session(cwd=str(ws), mcp_servers=[])
            first = await conn.prompt(session_id=new.session_id, prompt=[text_block("one")])
            assert first.stop_reason == "end_turn"
            assert client.switched == [new.session_id]
            # the running turn kept its mode: the question was asked and its "allow" held
            assert (ws / "notes.txt").read_text() == "allowed\n"
            second = await conn.prompt(session_id=new.session_id, prompt=[text_block("two")])
            assert second.stop_reason == "end_turn"
            assert len(client.asked) == 1  # read-only refuses without asking
            [failed] = [u for u in client.of("tool_call_update") if u.status == "failed"]
            assert failed is not None

    run(go)
    assert not (ws / "other.txt").exists()
    assert "Traceback" not in err.read_text()
