"""``dsh acp`` driven by the ACP Python SDK's own client over a real child process: a
streamed prompt with a tool call and the permission round trip (allowed: written; rejected:
unchanged), cancel in the middle of a slow stream, and ``session/load`` in a new process after
the first was killed with SIGKILL (the ledger is the truth)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_acp")
pytest.importorskip("dsh_shell")

from acp import text_block  # noqa: E402

from tests.acp_helpers import config  # noqa: E402
from tests.acp_helpers import initialized  # noqa: E402
from tests.acp_helpers import run  # noqa: E402
from tests.acp_helpers import spawn  # noqa: E402
from tests.acp_helpers import write_call as _write  # noqa: E402
from tests.servers import Reply  # noqa: E402
from tests.servers import ScriptedServer  # noqa: E402
from tests.servers import openai_chunks  # noqa: E402
from tests.servers import openai_completion  # noqa: E402


def _ledger(tmp: Path, session_id: str) -> list[dict[str, Any]]:
    path = tmp / "sessions" / f"{session_id}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_prompt_tool_call_permissions_and_load_after_sigkill(
        tmp_path: Path, script: Callable[..., str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("mine\n")
    model = script(_write("notes.txt", "allowed\n"), {"text": "wrote the notes"},
                   _write("other.txt", "denied\n"), {"text": "did not write it"})
    cfg = config(tmp_path, ws, model)
    err = tmp_path / "stderr.txt"

    async def first() -> str:
        async with spawn(cfg, cwd=ws, stderr=err) as (conn, proc, client):
            init = await initialized(conn)
            assert init.protocol_version == 1
            caps = init.agent_capabilities
            assert caps.load_session is True
            assert caps.prompt_capabilities.image is False
            assert caps.mcp_capabilities.http is False
            new = await conn.new_session(cwd=str(ws), mcp_servers=[])
            sid = new.session_id
            assert new.modes.current_mode_id == "ask"
            assert [m.id for m in new.modes.available_modes] == [
                "read-only", "plan", "ask", "auto-edit", "full-auto"]

            answer = await conn.prompt(session_id=sid, prompt=[text_block("write the notes")])
            assert answer.stop_reason == "end_turn"
            assert (ws / "notes.txt").read_text() == "allowed\n"
            assert client.text() == "wrote the notes"
            [start] = client.of("tool_call")
            assert (start.kind, start.title) == ("edit", "write_file: notes.txt")
            assert start.raw_input == {"path": "notes.txt", "content": "allowed\n"}
            assert [loc.path for loc in start.locations] == [str(ws / "notes.txt")]
            [(asked_sid, call, options)] = client.asked
            assert asked_sid == sid and call.tool_call_id == start.tool_call_id
            assert "notes.txt" in call.title
            [shown] = call.content  # the question shows the change as a diff
            assert (shown.type, shown.path, shown.old_text, shown.new_text) == (
                "diff", str(ws / "notes.txt"), "mine\n", "allowed\n")
            assert [o.kind for o in options] == ["allow_once", "allow_always", "reject_once"]
            [done] = client.of("tool_call_update")
            assert done.status == "completed" and done.tool_call_id == start.tool_call_id
            [diff] = [c for c in done.content if c.type == "diff"]
            assert (diff.path, diff.old_text, diff.new_text) == (
                str(ws / "notes.txt"), "mine\n", "allowed\n")
            # the tool call is shown before the question about it, the answer after
            kinds = client.kinds()
            assert kinds.index("tool_call") < kinds.index("tool_call_update")
            statuses = [u.status for u in client.updates_of("tool_call_update")]
            assert statuses == ["in_progress", "completed"]

            client.updates.clear()
            client.answer = "reject"
            answer = await conn.prompt(session_id=sid, prompt=[text_block("write other")])
            assert answer.stop_reason == "end_turn"
            assert not (ws / "other.txt").exists()
            [done] = client.of("tool_call_update")
            assert done.status == "failed"
            assert client.text() == "did not write it"
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            return sid

    sid = run(first)
    decisions = [e["data"] for e in _ledger(tmp_path, sid) if e["type"] == "x/dsh.tools/approval"]
    assert [(d["allowed"], d["by"]) for d in decisions] == [(True, "editor"), (False, "editor")]

    async def second() -> None:
        async with spawn(cfg, cwd=ws, stderr=err) as (conn, proc, client):
            await initialized(conn)
            listed = await conn.list_sessions(cwd=str(ws))
            assert [s.session_id for s in listed.sessions] == [sid]
            assert listed.sessions[0].title == "write the notes"
            loaded = await conn.load_session(cwd=str(ws), session_id=sid, mcp_servers=[])
            assert loaded.modes.current_mode_id == "ask"
            kinds = [k for k in client.kinds() if k != "available_commands_update"]
            assert kinds == ["user_message_chunk", "tool_call", "tool_call_update",
                             "agent_message_chunk", "user_message_chunk", "tool_call",
                             "tool_call_update", "agent_message_chunk"]
            assert client.text("user_message_chunk") == "write the noteswrite other"
            done = client.of("tool_call_update")
            assert [d.status for d in done] == ["completed", "failed"]
            [diff] = [c for c in done[0].content if c.type == "diff"]
            assert (diff.old_text, diff.new_text) == ("mine\n", "allowed\n")
            # and it resumes: the next prompt continues the ledger
            client.updates.clear()
            with pytest.raises(Exception, match="already open"):
                await conn.load_session(cwd=str(ws), session_id=sid, mcp_servers=[])

    run(second)
    assert "Traceback" not in err.read_text()


def test_cancel_mid_stream_answers_cancelled_and_the_session_resumes(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with ScriptedServer() as server:
        server.script(Reply(chunks=openai_chunks(text=[f"word{i} " for i in range(100)]),
                            chunk_delay=0.3),
                      Reply(body=openai_completion("resumed fine")))
        cfg = config(tmp_path, ws, "oa",
                     f'[models.oa]\nadapter = "openai"\nmodel = "gpt-4o"\n'
                     f'base_url = "{server.url}/v1"\nretries = 0\n')
        err = tmp_path / "stderr.txt"

        async def go() -> None:
            async with spawn(cfg, cwd=ws, stderr=err,
                             extra_env={"OPENAI_API_KEY": "sk-test-acp"}) as (conn, _, client):
                await initialized(conn)
                sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
                task = asyncio.create_task(
                    conn.prompt(session_id=sid, prompt=[text_block("talk slowly")]))
                await asyncio.wait_for(client.seen.wait(), 60)  # the stream has started
                await conn.cancel(session_id=sid)
                answer = await asyncio.wait_for(task, 60)
                assert answer.stop_reason == "cancelled"
                assert client.text().startswith("word0")
                assert "word99" not in client.text()
                ends = [e for e in _ledger(tmp_path, sid) if e["type"] == "turn/end"]
                assert (ends[-1]["outcome"], ends[-1]["reason"]) == (
                    "aborted", "run aborted: cancelled by the editor")
                client.updates.clear()
                again = await conn.prompt(session_id=sid, prompt=[text_block("go on")])
                assert again.stop_reason == "end_turn"
                assert client.text() == "resumed fine"

        run(go)
    assert "Traceback" not in err.read_text()


def test_stdout_carries_only_the_protocol(tmp_path: Path, script: Callable[..., str]) -> None:
    """A plugin that prints to stdout writes to stderr under ``dsh acp``."""
    ws = tmp_path / "ws"
    ws.mkdir()
    plugin = tmp_path / "noisy_plugin.py"
    plugin.write_text("from dsh.hookspecs import hookimpl\n"
                      "@hookimpl\n"
                      "def observe_event(event):\n"
                      "    print('NOISE ON STDOUT', flush=True)\n")
    cfg = config(tmp_path, ws, script({"text": "quiet answer"}))
    cfg.write_text('load = ["noisy_plugin"]\n' + cfg.read_text())
    err = tmp_path / "stderr.txt"

    async def go() -> None:
        async with spawn(cfg, cwd=ws, stderr=err,
                         extra_env={"PYTHONPATH": str(tmp_path) + os.pathsep
                                    + os.environ.get("PYTHONPATH", "")}) as (conn, _, client):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
            answer = await conn.prompt(session_id=sid, prompt=[text_block("hi")])
            assert answer.stop_reason == "end_turn"
            assert client.text() == "quiet answer"

    run(go)
    assert "NOISE ON STDOUT" in err.read_text()
