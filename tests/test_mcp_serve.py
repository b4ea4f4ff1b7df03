"""``dsh mcp serve``: dsh agents as MCP tools, driven by the MCP SDK's own clients
(``stdio_client`` and ``streamable_http_client`` with ``ClientSession``) against a real
``python -m dsh mcp serve`` process with a scripted model. What is checked is what a client
sees (tools, results, progress notifications) and what dsh recorded (the files, the ledger,
``dsh sessions show``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dsh_mcp")
pytest.importorskip("dsh_shell")
anyio = pytest.importorskip("anyio")
from mcp import ClientSession  # noqa: E402
from mcp import StdioServerParameters  # noqa: E402
from mcp import stdio_client  # noqa: E402

WRITE = {"tool_calls": [{"name": "write_file", "arguments": {"path": "notes.txt",
                                                             "content": "changed"}}]}
TIMEOUT = 90


def config(tmp_path: Path, model: str, extra: str = "") -> Path:
    """A config with its sessions under ``tmp_path``, the scripted ``model``, a workspace
    ``tmp_path/ws`` (holding ``notes.txt``) and a second agent ``helper``."""
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    if not (ws / "notes.txt").exists():
        (ws / "notes.txt").write_text("mine\n")
    path = tmp_path / "dsh.toml"
    path.write_text(textwrap.dedent(f"""
        sessions_dir = {json.dumps(str(tmp_path / "sessions"))}
        model = {json.dumps(model)}
        [plugins.shell]
        workspace = {json.dumps(str(ws))}
        [agents.helper]
        system = "You help."
    """) + textwrap.dedent(extra))
    return path


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("DSH_LOAD_PLUGINS", "DSH_CONFIG")}


def dsh(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env(),
                          stdin=subprocess.DEVNULL, start_new_session=True)


def ledger(tmp_path: Path, session: str) -> list[dict[str, Any]]:
    path = tmp_path / "sessions" / f"{session}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@contextlib.asynccontextmanager
async def stdio(cfg: Path, *args: str, errlog: Path | None = None
                ) -> AsyncIterator[ClientSession]:
    """A ClientSession with ``dsh --config CFG mcp serve ARGS`` over stdio, initialized."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "dsh", "--config", str(cfg), "mcp", "serve", *args],
        env=env())
    log = errlog or cfg.parent / "serve-stderr.txt"
    with log.open("a") as err, anyio.fail_after(TIMEOUT):
        async with stdio_client(params, errlog=err) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


class Progress:
    """A progress callback that keeps the messages."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.values: list[float] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.values.append(progress)
        self.messages.append(message or "")


def test_the_tools_and_their_schemas(tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script({"text": "hi"}))

    async def main() -> dict[str, Any]:
        async with stdio(cfg, "--agent", "default", "--agent", "helper") as client:
            listed = await client.list_tools()
            return {t.name: t for t in listed.tools}

    tools = anyio.run(main)
    assert sorted(tools) == ["fork", "resume", "run", "search"]
    run = tools["run"].input_schema
    assert run["required"] == ["prompt"] and run["additionalProperties"] is False
    assert run["properties"]["prompt"]["type"] == "string"
    assert run["properties"]["agent"]["enum"] == ["default", "helper"]
    assert tools["resume"].input_schema["required"] == ["session", "prompt"]
    assert tools["fork"].input_schema["properties"]["at"] == {
        "type": "integer", "minimum": 0, "description": tools["fork"].input_schema[
            "properties"]["at"]["description"]}
    assert tools["search"].input_schema["required"] == ["text"]
    assert tools["run"].output_schema["required"] == ["session", "output", "outcome"]
    assert tools["search"].annotations.read_only_hint is True
    assert tools["run"].annotations.read_only_hint is False


def test_run_resume_fork_and_search_are_dsh_sessions(tmp_path: Path,
                                                     script: Callable[..., str]) -> None:
    """A write in mode ask is refused (no one to ask), progress says so as it happens; the
    session continues with its history, forks, is found, and ``dsh sessions show`` shows it."""
    cfg = config(tmp_path, script(WRITE, {"text": "first answer"}, {"text": "second answer"}))
    progress = Progress()

    async def main() -> dict[str, Any]:
        async with stdio(cfg) as client:
            first = await client.call_tool("run", {"prompt": "write the notes"},
                                           progress_callback=progress)
            sid = first.structured_content["session"]
            second = await client.call_tool("resume", {"session": "latest",
                                                       "prompt": "and now?"})
            forked = await client.call_tool("fork", {"session": sid, "at": 1})
            found = await client.call_tool("search", {"text": "NOW and"})
            missing = await client.call_tool("search", {"text": "zebra"})
            return {"first": first, "second": second, "fork": forked, "found": found,
                    "missing": missing}

    got = anyio.run(main)
    first, second = got["first"], got["second"]
    assert not first.is_error and first.structured_content["outcome"] == "completed"
    assert first.structured_content["output"] == "first answer"
    sid = first.structured_content["session"]
    assert first.content[0].text.startswith("first answer") and sid in first.content[0].text
    assert (tmp_path / "ws" / "notes.txt").read_text() == "mine\n"  # refused: no one to ask
    assert progress.messages[0].startswith(f"session {sid}")
    assert "→ write_file notes.txt" in progress.messages
    refused = [m for m in progress.messages if m.startswith("write_file refused")]
    assert refused and "--mode auto-edit" in refused[0]
    assert progress.values == sorted(progress.values) and len(set(progress.values)) == len(
        progress.values)
    events = ledger(tmp_path, sid)
    [decision] = [e["data"] for e in events if e["type"] == "x/dsh.tools/approval"]
    assert (decision["allowed"], decision["by"], decision["mode"]) == (False, "no-one", "ask")
    # resume: the same session, its history sent (the script's position is the number of
    # answers in the request: the third response means the model saw both earlier ones)
    assert not second.is_error
    assert second.structured_content == {"session": sid, "output": "second answer",
                                         "outcome": "completed"}
    events = ledger(tmp_path, sid)
    assert [e["type"] for e in events].count("turn/start") == 2
    assert [e["text"] for e in events if e["type"] == "user/message"] == [
        "write the notes", "and now?"]
    # fork: a new session after turn 1
    new = got["fork"].structured_content
    assert not got["fork"].is_error and new["parent"] == sid and new["at"] == 1
    assert new["session"] != sid
    assert ledger(tmp_path, new["session"])[0]["type"] == "session/fork"
    # search: the session whose message holds every word
    hits = got["found"].structured_content["sessions"]
    assert [h["session"] for h in hits] == [sid]
    assert hits[0]["kind"] == "user" and "now" in hits[0]["snippet"]
    assert got["missing"].structured_content == {"sessions": []}
    # each is an ordinary dsh session
    shown = dsh(cfg, "sessions", "show", sid)
    assert shown.returncode == 0, shown.stderr
    assert "write the notes" in shown.stdout and "second answer" in shown.stdout
    shown = dsh(cfg, "sessions", "show", new["session"])
    assert shown.returncode == 0 and f"forked from {sid} at turn 1" in shown.stdout


def test_auto_edit_lets_writes_run(tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script(WRITE, {"text": "written"}))

    async def main() -> Any:
        async with stdio(cfg, "--mode", "auto-edit") as client:
            return await client.call_tool("run", {"prompt": "write the notes"})

    result = anyio.run(main)
    assert not result.is_error and result.structured_content["output"] == "written"
    assert (tmp_path / "ws" / "notes.txt").read_text() == "changed"
    events = ledger(tmp_path, result.structured_content["session"])
    [decision] = [e["data"] for e in events if e["type"] == "x/dsh.tools/approval"]
    assert (decision["allowed"], decision["by"], decision["mode"]) == (True, "mode",
                                                                       "auto-edit")


def test_agents_root_and_a_failing_run(tmp_path: Path, script: Callable[..., str]) -> None:
    """``--agent`` chooses who may run; ``--root`` is the workspace of agents whose config
    names none; a model error is a tool error, and the server goes on serving."""
    bad = script({"error": "the provider fell over", "status": 400})
    good = script({"text": "helped"})
    cfg = config(tmp_path, good, f"""
        [agents.broken]
        model = {json.dumps(bad)}
    """)
    root = tmp_path / "elsewhere"
    root.mkdir()

    async def main() -> list[Any]:
        async with stdio(cfg, "--agent", "helper", "--agent", "broken", "--root",
                         str(root)) as client:
            return [await client.call_tool("run", {"prompt": "help", "agent": "broken"}),
                    await client.call_tool("run", {"prompt": "help"}),
                    await client.call_tool("run", {"prompt": "help", "agent": "default"})]

    failed, helped, unknown = anyio.run(main)
    assert failed.is_error
    assert "the provider fell over" in failed.content[0].text
    assert failed.structured_content["outcome"] == "error"
    assert not helped.is_error and helped.structured_content["output"] == "helped"
    events = ledger(tmp_path, helped.structured_content["session"])
    assert events[0]["agent"] == "helper"  # the first --agent is the default
    assert events[0]["cwd"] == str(root.resolve())
    assert unknown.is_error and "unknown agent 'default'" in unknown.content[0].text
    assert "helper, broken" in unknown.content[0].text


@contextlib.contextmanager
def http_server(cfg: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``dsh mcp serve --http --port 0 ARGS``; yields the URL it printed and the process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsh", "--config", str(cfg), "mcp", "serve", "--http",
         "--port", "0", *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=env(), start_new_session=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until the server says where it listens
        found = re.search(r"listening on (http://127\.0\.0\.1:(\d+)/mcp)", line)
        assert found and found.group(2) != "0", line + (proc.stderr.read() if proc.poll() else "")
        yield found.group(1), proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@contextlib.asynccontextmanager
async def http_client(url: str) -> AsyncIterator[ClientSession]:
    from mcp.client.streamable_http import streamable_http_client

    with anyio.fail_after(TIMEOUT):
        async with streamable_http_client(url) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


def test_streamable_http_with_progress(tmp_path: Path, script: Callable[..., str]) -> None:
    cfg = config(tmp_path, script(WRITE, {"text": "over http"}, {"text": "again over http"}))
    progress = Progress()
    with http_server(cfg, "--mode", "auto-edit") as (url, proc):
        async def main() -> list[Any]:
            async with http_client(url) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                first = await client.call_tool("run", {"prompt": "write"},
                                               progress_callback=progress)
                again = await client.call_tool(
                    "resume", {"session": first.structured_content["session"],
                               "prompt": "more"})
                return [names, first, again]

        names, first, again = anyio.run(main)
        assert proc.poll() is None
    assert names == ["run", "resume", "fork", "search"]
    assert not first.is_error and first.structured_content["output"] == "over http"
    assert again.structured_content["output"] == "again over http"
    assert (tmp_path / "ws" / "notes.txt").read_text() == "changed"
    assert "→ write_file notes.txt" in progress.messages
    assert any(m.startswith("← write_file ok") for m in progress.messages)


def test_a_cancelled_call_aborts_its_turn(tmp_path: Path, script: Callable[..., str]) -> None:
    """The client gives up on a slow turn (the SDK sends ``notifications/cancelled``): the
    turn is aborted and its ledger closed, and the server answers the next call."""
    cfg = config(tmp_path, script({"delay": 60, "text": "too late"}))
    other = script({"text": "next"})
    cfg.write_text(cfg.read_text() + f"[agents.quick]\nmodel = {json.dumps(other)}\n")
    progress = Progress()

    async def main() -> Any:
        async with stdio(cfg, "--agent", "default", "--agent", "quick") as client:
            with anyio.move_on_after(60) as scope:  # until the turn has started
                async with anyio.create_task_group() as group:
                    async def call() -> None:
                        await client.call_tool("run", {"prompt": "slow"},
                                               progress_callback=progress)

                    group.start_soon(call)
                    while not any(m.startswith("step 1") for m in progress.messages):
                        await anyio.sleep(0.05)
                    group.cancel_scope.cancel()
            assert not scope.cancelled_caught
            with anyio.fail_after(TIMEOUT):
                while True:  # the abort is recorded (the scripted delay wakes on it)
                    ends = [e for e in ledger(tmp_path, sid(progress)) if e["type"] == "turn/end"]
                    if ends:
                        break
                    await anyio.sleep(0.1)
            return ends, await client.call_tool("run", {"prompt": "hi", "agent": "quick"})

    ends, after = anyio.run(main)
    assert ends[0]["outcome"] == "aborted" and "cancelled" in ends[0]["reason"]
    assert after.structured_content["output"] == "next"


def sid(progress: Progress) -> str:
    return progress.messages[0].split()[1]
