"""``dsh acp``'s session features through the ACP Python SDK's client: permission modes
(``session/set_mode``), "Allow for this session", the task list as ``plan`` updates, the
agent's ``/`` commands (``available_commands_update``, and a prompt that runs one), and
``session/list`` filtered by cwd."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("dsh_acp")
pytest.importorskip("dsh_shell")

from acp import RequestError  # noqa: E402
from acp import text_block  # noqa: E402

from tests.acp_helpers import config  # noqa: E402
from tests.acp_helpers import initialized  # noqa: E402
from tests.acp_helpers import run  # noqa: E402
from tests.acp_helpers import spawn  # noqa: E402
from tests.acp_helpers import write_call as _write  # noqa: E402


def test_modes_and_a_grant_for_the_session(tmp_path: Path, script: Callable[..., str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    model = script(_write("a.txt", "1\n"), {"text": "refused"},
                   _write("b.txt", "2\n"), _write("c.txt", "3\n"), {"text": "both"},
                   _write("d.txt", "4\n"), {"text": "auto"})
    cfg = config(tmp_path, ws, model)

    async def go() -> None:
        async with spawn(cfg, cwd=ws, stderr=tmp_path / "err.txt") as (conn, _, client):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
            with pytest.raises(RequestError, match="unknown mode 'yolo'"):
                await conn.set_session_mode(session_id=sid, mode_id="yolo")
            await conn.set_session_mode(session_id=sid, mode_id="read-only")
            await conn.prompt(session_id=sid, prompt=[text_block("write a")])
            assert client.asked == [] and not (ws / "a.txt").exists()  # the mode refused it
            await conn.set_session_mode(session_id=sid, mode_id="ask")
            client.answer = "allow-session"
            await conn.prompt(session_id=sid, prompt=[text_block("write b and c")])
            assert (ws / "b.txt").read_text() == "2\n" and (ws / "c.txt").read_text() == "3\n"
            assert len(client.asked) == 1  # c.txt is in the directory granted for b.txt
            await conn.set_session_mode(session_id=sid, mode_id="auto-edit")
            client.answer = "reject"
            await conn.prompt(session_id=sid, prompt=[text_block("write d")])
            assert (ws / "d.txt").read_text() == "4\n" and len(client.asked) == 1

    run(go)


def test_plan_updates_commands_and_listing(tmp_path: Path, script: Callable[..., str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    other = ws / "sub"
    other.mkdir()
    plugin = tmp_path / "acp_test_commands.py"
    plugin.write_text(
        "from dsh.hookspecs import hookimpl\n"
        "@hookimpl\n"
        "def list_commands(agent):\n"
        "    return {'review': 'Review the change'}\n"
        "@hookimpl\n"
        "def expand_command(name, arguments, agent):\n"
        "    return f'Please review: {arguments}' if name == 'review' else None\n")
    tasks = {"tool_calls": [{"name": "update_tasks", "arguments": {"tasks": [
        {"content": "read the code", "status": "completed"},
        {"content": "fix the bug", "status": "in_progress"}]}}]}
    model = script(tasks, {"text": "planned"}, {"text": "reviewed"}, {"text": "elsewhere"})
    cfg = config(tmp_path, ws, model, '[plugins."dsh.tasks"]\nenabled = true\n')
    cfg.write_text('load = ["acp_test_commands"]\n' + cfg.read_text())
    path = {"PYTHONPATH": str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", "")}

    async def go() -> None:
        async with spawn(cfg, cwd=ws, stderr=tmp_path / "err.txt",
                         extra_env=path) as (conn, _, client):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text_block("plan it")])
            [commands] = client.of("available_commands_update")
            assert [(c.name, c.description) for c in commands.available_commands] == [
                ("review", "Review the change")]
            [plan] = client.of("plan")
            assert [(e.content, e.status) for e in plan.entries] == [
                ("read the code", "completed"), ("fix the bug", "in_progress")]
            answer = await conn.prompt(session_id=sid, prompt=[text_block("/review the diff")])
            assert answer.stop_reason == "end_turn"
            with pytest.raises(RequestError, match="unknown command"):
                await conn.prompt(session_id=sid, prompt=[text_block("/nope")])
            sub = (await conn.new_session(cwd=str(other), mcp_servers=[])).session_id
            await conn.prompt(session_id=sub, prompt=[text_block("in sub")])
            here = await conn.list_sessions(cwd=str(ws))
            assert [s.session_id for s in here.sessions] == [sid]
            assert here.sessions[0].title == "plan it"
            everywhere = await conn.list_sessions()
            assert {s.session_id for s in everywhere.sessions} == {sid, sub}

    run(go)
    ledgers = [p.read_text() for p in (tmp_path / "sessions").glob("*.jsonl")]
    assert sum("Please review: the diff" in text for text in ledgers) == 1


def test_the_model_and_mode_as_config_options(tmp_path: Path,
                                              script: Callable[..., str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    first = script({"text": "from the first"})
    second = script({"text": "from the second"})
    path = second.split(":", 1)[1]
    cfg = config(tmp_path, ws, first,
                 f'[models.other]\nadapter = "scripted"\nmodel = "{path}"\n')

    async def go() -> None:
        async with spawn(cfg, cwd=ws, stderr=tmp_path / "err.txt") as (conn, _, client):
            await initialized(conn)
            new = await conn.new_session(cwd=str(ws), mcp_servers=[])
            sid = new.session_id
            by_id = {o.id: o for o in new.config_options}
            assert by_id["model"].current_value == first
            assert [o.value for o in by_id["model"].options] == [first, "other"]
            assert by_id["mode"].current_value == "ask"
            with pytest.raises(RequestError, match="not one of the configured models"):
                await conn.set_config_option(config_id="model", session_id=sid,
                                             value="scripted:/etc/passwd")
            with pytest.raises(RequestError, match="unknown config option"):
                await conn.set_config_option(config_id="temperature", session_id=sid,
                                             value="2")
            changed = await conn.set_config_option(config_id="model", session_id=sid,
                                                   value="other")
            assert {o.id: o.current_value for o in changed.config_options} == {
                "mode": "ask", "model": "other"}
            await conn.prompt(session_id=sid, prompt=[text_block("hi")])
            assert client.text() == "from the second"
            changed = await conn.set_config_option(config_id="mode", session_id=sid,
                                                   value="read-only")
            assert {o.id: o.current_value for o in changed.config_options}["mode"] == (
                "read-only")

    run(go)


def test_ask_user_never_opens_a_terminal(tmp_path: Path, script: Callable[..., str]) -> None:
    """The person is in the editor: the workbench's question fails at once."""
    ws = tmp_path / "ws"
    ws.mkdir()
    model = script({"tool_calls": [{"name": "ask_user", "arguments": {"question": "which?"}}]},
                   {"text": "decided myself"})
    cfg = config(tmp_path, ws, model)

    async def go() -> None:
        async with spawn(cfg, cwd=ws, stderr=tmp_path / "err.txt") as (conn, _, client):
            await initialized(conn)
            sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
            await conn.prompt(session_id=sid, prompt=[text_block("go")])
            [done] = client.of("tool_call_update")
            assert done.status == "failed"
            assert "no one can answer" in done.content[0].content.text
            assert client.text() == "decided myself"

    run(go)
