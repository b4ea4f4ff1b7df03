"""Shared fixtures of the dsh-claude command, agent and folder tests (issue 24, items 3-5):
a project folder with ``.claude/``, a config pointing dsh at a loopback OpenAI-compatible
server (tests/servers.py), and ``dsh`` run as a real subprocess in that folder, with ``HOME``
under the test's own directory (so ``~/.claude`` is the test's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.servers import ScriptedServer

REPO = Path(__file__).resolve().parent.parent

pytest.importorskip("dsh_claude", reason="the dsh-claude plugin is not installed")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


class Project:
    """A project folder (``root``), a home (``home``), a config and a server."""

    def __init__(self, tmp: Path, server: ScriptedServer) -> None:
        self.tmp = tmp
        self.root = tmp / "project"
        self.home = tmp / "home"
        self.sessions = tmp / "sessions"
        self.server = server
        (self.root / ".git").mkdir(parents=True)
        self.home.mkdir()
        self.config = tmp / "dsh.toml"
        self.extra = ""
        self.write_config()

    def write_config(self, extra: str = "") -> None:
        self.extra = extra
        self.config.write_text(
            'model = "oa"\ncompaction = "off"\n'
            f'sessions_dir = "{self.sessions}"\n'
            f'[models.oa]\nadapter = "openai"\nmodel = "gpt-4o"\n'
            f'base_url = "{self.server.url}/v1"\nretries = 0\n' + extra)

    def env(self) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items()
             if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "DSH_CONFIG", "CLAUDE_CONFIG_DIR",
                          "CODEX_HOME")}  # ~/.claude and ~/.codex: under this HOME
        e.update(OPENAI_API_KEY="sk-test-claude", PYTHONPATH=str(REPO), HOME=str(self.home),
                 DSH_HOME=str(self.tmp / "dsh-home"),
                 XDG_CONFIG_HOME=str(self.tmp / "xdg"))
        return e

    def dsh(self, *args: str, input: str | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dsh", "--config", str(self.config),
                               *args], capture_output=True, text=True, env=self.env(),
                              timeout=120, cwd=cwd or self.root, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)

    def approve(self, *paths: Path) -> None:
        """``dsh trust approve PATH…``: the person trusts these files' current bytes (kept
        under this test's ``XDG_CONFIG_HOME``, which every ``dsh`` here uses)."""
        done = self.dsh("trust", "approve", *map(str, paths))
        assert done.returncode == 0, done.stderr

    def popen(self, *args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "dsh", "--config", str(self.config),
                                 *args], env=self.env(), cwd=self.root,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def events(self, session: str) -> list[dict[str, Any]]:
        path = self.sessions / f"{session}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def user_messages(self, session: str) -> list[str]:
        return [e["text"] for e in self.events(session) if e["type"] == "user/message"]


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def project(tmp_path: Path, server: ScriptedServer) -> Project:
    return Project(tmp_path, server)


def last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message of an OpenAI chat request body."""
    user = [m for m in body["messages"] if m["role"] == "user"][-1]
    content = user["content"]
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content)
    return str(content)
