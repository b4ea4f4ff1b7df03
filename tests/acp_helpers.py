"""What the ACP tests share: a config, and an ACP client (the official Python SDK's own
``ClientSideConnection``) talking to ``dsh acp`` in a child process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from collections.abc import Callable
from pathlib import Path
from typing import Any

import acp
from acp import schema


def config(tmp: Path, ws: Path, model: str, extra: str = "") -> Path:
    cfg = tmp / "dsh.toml"
    cfg.write_text(f'model = {json.dumps(model)}\ncompaction = "off"\n'
                   f'sessions_dir = {json.dumps(str(tmp / "sessions"))}\n'
                   f'[plugins.shell]\nworkspace = {json.dumps(str(ws))}\n' + extra)
    return cfg


def env(**more: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("DSH_LOAD_PLUGINS", "DSH_CONFIG")}
    e.update(NO_COLOR="1", **more)
    return e


class Client:
    """Records every ``session/update``; answers permission questions with ``answer``
    (an option id, ``"cancelled"``, or ``None``: never answer)."""

    def __init__(self) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.asked: list[Any] = []
        self.answer: str | None = "allow"
        self.seen = asyncio.Event()

    async def request_permission(self, options: list[Any], session_id: str, tool_call: Any,
                                 **kwargs: Any) -> schema.RequestPermissionResponse:
        self.asked.append((session_id, tool_call, options))
        if self.answer is None:
            await asyncio.Event().wait()  # never answers
        if self.answer == "cancelled":
            return schema.RequestPermissionResponse(
                outcome=schema.DeniedOutcome(outcome="cancelled"))
        return schema.RequestPermissionResponse(
            outcome=schema.AllowedOutcome(outcome="selected", option_id=self.answer))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self.seen.set()

    def kinds(self) -> list[str]:
        return [u.session_update for _, u in self.updates]

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(u.content.text for _, u in self.updates if u.session_update == kind)

    def updates_of(self, kind: str) -> list[Any]:
        return [u for _, u in self.updates if u.session_update == kind]

    def of(self, kind: str) -> list[Any]:
        """The updates of ``kind``; for ``tool_call_update``, the final ones (completed or
        failed: not the ``in_progress`` of a call that starts)."""
        return [u for _, u in self.updates if u.session_update == kind
                and getattr(u, "status", None) != "in_progress"]


@contextlib.asynccontextmanager
async def spawn(cfg: Path, *args: str, cwd: Path, stderr: Path,
                client: Client | None = None, extra_env: dict[str, str] | None = None
                ) -> AsyncIterator[tuple[Any, Any, Client]]:
    client = client or Client()
    with open(stderr, "ab") as err:
        async with acp.spawn_agent_process(
                client, sys.executable, "-m", "dsh", "--config", str(cfg), "acp", *args,
                env=env(**(extra_env or {})), cwd=str(cwd),
                transport_kwargs={"stderr": err}) as (conn, proc):
            yield conn, proc, client


async def initialized(conn: Any) -> Any:
    return await asyncio.wait_for(conn.initialize(protocol_version=acp.PROTOCOL_VERSION), 60)


def run(coro_fn: Callable[[], Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 120))


def workspace(tmp: Path) -> Path:
    """A test's workbench workspace, holding one file of the person's: ``notes.txt``."""
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("mine\n")
    return ws


def write_call(path: str, content: str) -> dict[str, Any]:
    """A scripted model's answer that calls ``write_file``."""
    return {"tool_calls": [{"name": "write_file",
                            "arguments": {"path": path, "content": content}}]}
