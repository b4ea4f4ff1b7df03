"""``dsh acp`` against an attacker's client, over the ACP Python SDK's own client: a
``session/load`` of another project's session (a cwd outside the allowed roots) is refused
and nothing of it is replayed; ``session/list`` never names it; a model id or a mode the
config does not know is refused; an embedded resource naming a file on disk is never read
from disk; an "allow" that arrives after the permission timeout is a no."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_acp")
pytest.importorskip("dsh_shell")

from acp import RequestError  # noqa: E402
from acp import schema  # noqa: E402
from acp import text_block  # noqa: E402

from tests.acp_helpers import Client  # noqa: E402
from tests.acp_helpers import config  # noqa: E402
from tests.acp_helpers import initialized  # noqa: E402
from tests.acp_helpers import run  # noqa: E402
from tests.acp_helpers import spawn  # noqa: E402


def _dirs(tmp: Path) -> tuple[Path, Path]:
    ours, theirs = tmp / "ours", tmp / "theirs"
    ours.mkdir()
    theirs.mkdir()
    return ours, theirs


def test_a_session_of_another_project_is_neither_loaded_nor_listed(
        tmp_path: Path, script: Callable[..., str]) -> None:
    ours, theirs = _dirs(tmp_path)
    cfg = config(tmp_path, ours, script({"text": "THEIR-SECRET-ANSWER"}))
    err = tmp_path / "err.txt"

    async def theirs_first() -> str:
        async with spawn(cfg, cwd=theirs, stderr=err) as (conn, _proc, _client):
            await initialized(conn)
            new = await conn.new_session(cwd=str(theirs), mcp_servers=[])
            await conn.prompt(session_id=new.session_id,
                              prompt=[text_block("their private prompt")])
            return str(new.session_id)

    sid = run(theirs_first)

    async def ours_then() -> None:
        async with spawn(cfg, cwd=ours, stderr=err) as (conn, _proc, client):
            await initialized(conn)
            listed = await conn.list_sessions()
            assert sid not in [s.session_id for s in listed.sessions]
            with pytest.raises(RequestError):
                await conn.load_session(cwd=str(ours), session_id=sid, mcp_servers=[])
            seen = " ".join(repr(u) for _, u in client.updates)
            assert "THEIR-SECRET-ANSWER" not in seen
            assert "their private prompt" not in seen

    run(ours_then)


def test_a_session_of_this_project_still_loads(
        tmp_path: Path, script: Callable[..., str]) -> None:
    ours, _ = _dirs(tmp_path)
    cfg = config(tmp_path, ours, script({"text": "our answer"}))
    err = tmp_path / "err.txt"

    async def both() -> None:
        async with spawn(cfg, cwd=ours, stderr=err) as (conn, _proc, _client):
            await initialized(conn)
            new = await conn.new_session(cwd=str(ours), mcp_servers=[])
            await conn.prompt(session_id=new.session_id, prompt=[text_block("hi")])
            sid = new.session_id
        async with spawn(cfg, cwd=ours, stderr=err) as (conn, _proc, client):
            await initialized(conn)
            await conn.load_session(cwd=str(ours), session_id=sid, mcp_servers=[])
            assert "our answer" in client.text()

    run(both)


def test_unknown_model_and_mode_are_refused_and_nothing_changes(
        tmp_path: Path, script: Callable[..., str]) -> None:
    ours, _ = _dirs(tmp_path)
    cfg = config(tmp_path, ours, script({"text": "ok"}))

    async def go() -> None:
        async with spawn(cfg, cwd=ours, stderr=tmp_path / "err.txt") as (conn, _p, _c):
            await initialized(conn)
            new = await conn.new_session(cwd=str(ours), mcp_servers=[])
            sid = new.session_id
            with pytest.raises(RequestError):
                await conn.set_session_mode(session_id=sid, mode_id="root-everything")
            with pytest.raises(RequestError):
                await conn.set_config_option(config_id="model", session_id=sid,
                                             value="http://evil.example/v1:gpt")
            with pytest.raises(RequestError):
                await conn.set_session_mode(session_id="no-such-session", mode_id="ask")
            answer = await conn.prompt(session_id=sid, prompt=[text_block("hi")])
            assert answer.stop_reason == "end_turn"

    run(go)


def test_an_embedded_resource_naming_a_file_is_not_read_from_disk(
        tmp_path: Path, script: Callable[..., str]) -> None:
    ours, _ = _dirs(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("DISK-SECRET-CONTENT\n")
    cfg = config(tmp_path, ours, script({"text": "ok"}))

    async def go() -> str:
        async with spawn(cfg, cwd=ours, stderr=tmp_path / "err.txt") as (conn, _p, _c):
            await initialized(conn)
            new = await conn.new_session(cwd=str(ours), mcp_servers=[])
            link = schema.ResourceContentBlock(type="resource_link", name="secret",
                                               uri=secret.as_uri())
            res = schema.EmbeddedResourceContentBlock(
                type="resource", resource=schema.TextResourceContents(
                    uri=secret.as_uri(), text="what the editor sent"))
            answer = await conn.prompt(session_id=new.session_id,
                                       prompt=[text_block("look"), link, res])
            assert answer.stop_reason == "end_turn"
            return str(new.session_id)

    sid = run(go)
    ledger = (tmp_path / "sessions" / f"{sid}.jsonl").read_text()
    assert "what the editor sent" in ledger
    assert "DISK-SECRET-CONTENT" not in ledger


class _LateAllow(Client):
    """Says "allow" only once the agent has given up on the question (the tool call failed)."""

    async def request_permission(self, options: Any, session_id: str, tool_call: Any,
                                 **kwargs: Any) -> schema.RequestPermissionResponse:
        self.asked.append((session_id, tool_call, options))
        while not any(getattr(u, "status", None) == "failed"
                      for u in self.updates_of("tool_call_update")):
            self.seen.clear()
            await self.seen.wait()
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id="allow"))


def test_an_allow_arriving_after_the_timeout_is_not_honoured(
        tmp_path: Path, script: Callable[..., str]) -> None:
    ours, _ = _dirs(tmp_path)
    (ours / "notes.txt").write_text("mine\n")
    cfg = config(tmp_path, ours, script(
        {"tool_calls": [{"name": "write_file",
                         "arguments": {"path": "notes.txt", "content": "late\n"}}]},
        {"text": "gave up"}, {"text": "second"}))

    async def go() -> None:
        client = _LateAllow()
        async with spawn(cfg, "--permission-timeout", "1", cwd=ours,
                         stderr=tmp_path / "err.txt", client=client) as (conn, _p, _c):
            await initialized(conn)
            new = await conn.new_session(cwd=str(ours), mcp_servers=[])
            answer = await conn.prompt(session_id=new.session_id,
                                       prompt=[text_block("write it")])
            assert answer.stop_reason == "end_turn"
            assert len(client.asked) == 1
            # the connection still works after the late answer, and nothing was written
            again = await conn.prompt(session_id=new.session_id, prompt=[text_block("more")])
            assert again.stop_reason == "end_turn"
        assert (ours / "notes.txt").read_text() == "mine\n"

    run(go)


def test_a_cwd_swapped_for_a_symlink_after_session_new_runs_nothing(
        tmp_path: Path, script: Callable[..., str]) -> None:
    ours, theirs = _dirs(tmp_path)
    project = ours / "project"
    project.mkdir()
    cfg = config(tmp_path, ours, script(
        {"tool_calls": [{"name": "write_file",
                         "arguments": {"path": "planted.txt", "content": "x\n"}}]},
        {"text": "done"}))

    async def go() -> None:
        async with spawn(cfg, "--mode", "full-auto", cwd=ours,
                         stderr=tmp_path / "err.txt") as (conn, _p, _c):
            await initialized(conn)
            new = await conn.new_session(cwd=str(project), mcp_servers=[])
            project.rename(ours / "moved")
            project.symlink_to(theirs)
            with pytest.raises(RequestError):
                await conn.prompt(session_id=new.session_id, prompt=[text_block("go")])

    run(go)
    assert not (theirs / "planted.txt").exists()
    assert not (ours / "moved" / "planted.txt").exists()
