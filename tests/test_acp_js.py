"""``dsh acp`` driven by a second, independent client: the official TypeScript SDK
(``@agentclientprotocol/sdk``, in tests/js) running tests/js/acp_client.mjs over the child's
stdio: initialize, session/new, a prompt with a tool call allowed and one rejected, a
cancelled prompt, and session/load in a new process after SIGKILL."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("dsh_acp")
pytest.importorskip("dsh_shell")

from tests.acp_helpers import config  # noqa: E402
from tests.acp_helpers import env  # noqa: E402
from tests.acp_helpers import write_call as _write  # noqa: E402

JS = Path(__file__).parent / "js"


def test_the_typescript_sdk_client(tmp_path: Path, script: Callable[..., str]) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    if not (JS / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
        pytest.fail("the ACP TypeScript SDK is missing: run npm ci --prefix tests/js")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("mine\n")
    model = script(_write("notes.txt", "allowed\n"), {"text": "wrote the notes"},
                   _write("other.txt", "denied\n"), {"text": "skipped it"},
                   {"text": "slowly", "delay": 60})
    cfg = config(tmp_path, ws, model)
    done = subprocess.run([node, str(JS / "acp_client.mjs"), sys.executable, str(cfg), str(ws)],
                          capture_output=True, text=True, timeout=120, env=env(), cwd=ws,
                          stdin=subprocess.DEVNULL)
    steps = {}
    for line in done.stdout.splitlines():
        item = json.loads(line)
        steps.setdefault(item.pop("step"), []).append(item)
    assert done.returncode == 0 and "error" not in steps, (done.stdout, done.stderr)
    assert steps["initialize"] == [{"protocolVersion": 1, "loadSession": True}]
    [new] = steps["new"]
    assert new["modes"] == ["read-only", "plan", "ask", "auto-edit", "full-auto"]
    assert [a["kinds"] for a in steps["asked"]] == [["allow_once", "allow_always",
                                                     "reject_once"]] * 2
    [allow] = steps["allow"]
    assert allow["stopReason"] == "end_turn" and allow["status"] == "completed"
    assert allow["kinds"][0] == "tool_call" and allow["text"] == "wrote the notes"
    assert allow["diff"] == {"path": str(ws / "notes.txt"), "oldText": "mine\n",
                             "newText": "allowed\n"}
    assert steps["reject"] == [{"stopReason": "end_turn", "statuses": ["in_progress", "failed"]}]
    assert steps["cancel"] == [{"stopReason": "cancelled"}]
    assert (ws / "notes.txt").read_text() == "allowed\n" and not (ws / "other.txt").exists()
    [load] = steps["load"]
    assert load["users"] == ["write the notes", "write the other", "take your time"]
    assert load["kinds"][:4] == ["user_message_chunk", "tool_call", "tool_call_update",
                                 "agent_message_chunk"]
    assert steps["exit"] == [{"code": 0}]
    assert "Traceback" not in done.stderr
