"""Provider faults end to end: ``dsh run -m openai:m`` against the loopback test servers.

Each case first answers with a tool call (so the turn has a finished tool step), then fails
the next request: 429 storms, 5xx, a slow server, a stream cut mid-answer, malformed SSE, an
unreachable host. In every case retries are bounded (the server counts the requests), dsh exits
1 with one ``dsh: error: …`` line on stderr and no traceback, and the ledger ends with
``turn/end`` outcome ``error`` and that reason, no dangling tool call, and resumes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import closed_port
from tests.servers import openai_chunks
from tests.servers import openai_completion

DSH = [sys.executable, "-m", "dsh"]
RETRIES = 2
TIMEOUT = 1.0  # read timeout of openai:m; the slow cases wait this long once

TOOL_PLUGIN = '''
from dsh import hookimpl

@hookimpl
def register_tools(register):
    def note(text: str) -> str:
        """Write a note."""
        return f"noted: {text}"
    register(note)
'''

TOOL_CALL = Reply(body=openai_completion(calls=[("call_1", "note", '{"text": "hi"}')]))


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def env(tmp_path: Path, server: ScriptedServer) -> dict[str, str]:
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "dshfault_tools.py").write_text(TOOL_PLUGIN)
    config = tmp_path / "dsh.toml"
    config.write_text(f'autoload = false\nload = ["dshfault_tools"]\n\n[models."openai:m"]\n'
                      f"retries = {RETRIES}\nretry_base = 0.01\ntimeout = {TIMEOUT}\n")
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS", "OPENAI_API_KEY", "OPENAI_BASE_URL")}
    e.update(DSH_CONFIG=str(config), PYTHONPATH=str(plugins),
             OPENAI_BASE_URL=f"{server.url}/v1", OPENAI_API_KEY="sk-test-fake-0000")
    return e


def dsh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=60)


def only_session(env: dict[str, str]) -> Path:
    (path,) = (Path(env["DSH_HOME"]) / "sessions").glob("*.jsonl")
    return path


def check_failed_run(env: dict[str, str], r: subprocess.CompletedProcess[str], events: bool,
                     message: str) -> list[dict[str, Any]]:
    """Exit 1, one clear stderr line matching ``message``, a consistent ledger that resumes."""
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stdout and "Traceback" not in r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("dsh: error: openai: "), line
    reason = line.removeprefix("dsh: error: ")
    assert re.search(message, reason), reason
    if events:
        result = json.loads(r.stdout.splitlines()[-1])
        assert (result["type"], result["outcome"], result["reason"]) == ("result", "error",
                                                                          reason)
    else:
        assert r.stdout == ""
    path = only_session(env)
    ledger = [json.loads(x) for x in path.read_text().splitlines()]
    assert [e["seq"] for e in ledger] == list(range(len(ledger)))
    end = ledger[-1]
    assert (end["type"], end["outcome"], end["reason"]) == ("turn/end", "error", reason)
    calls = {e["call_id"] for e in ledger if e["type"] == "tool/call"}
    answered = {e["call_id"] for e in ledger if e["type"] == "tool/result"}
    assert calls == answered  # no dangling tool call
    types = [e["type"] for e in ledger]
    assert types.count("step/start") == types.count("step/end")
    again = dsh(env, "run", "--session", path.stem, "-m", "echo", "x")
    assert (again.returncode, again.stdout) == (0, "x\n")
    # -m switched the session's recorded model: said in one line, nothing else
    assert again.stderr == f"dsh: note: session {path.stem} continues on echo (was openai:m)\n"
    return ledger


def storm(reply: Reply, n: int = RETRIES + 3) -> list[Reply]:
    """More failing replies than the retries allow, to see that dsh stops asking."""
    return [reply] * n


FAULTS: dict[str, tuple[list[Reply], bool, str, int]] = {
    # name: (replies after the tool call, --events, message pattern, requests they take)
    "429 storm": (
        storm(Reply(429, {"error": {"message": "Rate limit reached for requests",
                                    "type": "requests"}}, {"retry-after": "0"})),
        False, rf"rate limited \(HTTP 429\): Rate limit reached for requests — still failing "
               rf"after {RETRIES} retries$", RETRIES + 1),
    "500s": (
        storm(Reply(500, {"error": {"message": "The server had an error processing your "
                                               "request."}})),
        False, rf"server error \(HTTP 500\): The server had an error processing your "
               rf"request\. — still failing after {RETRIES} retries$", RETRIES + 1),
    "502 html from a proxy": (
        storm(Reply(502, "<html><body>502 Bad Gateway</body></html>",
                    {"content-type": "text/html"})),
        False, rf"server error \(HTTP 502\): .*Bad Gateway.* — still failing after {RETRIES} "
               r"retries$", RETRIES + 1),
    "slow response": (
        [Reply(body=openai_completion("too late"), delay=30)],
        False, rf"no data from http://127\.0\.0\.1:\d+/v1/chat/completions for {TIMEOUT:g}s "
               r"\(read timeout\)", 1),
    "stall mid-stream": (
        [Reply(chunks=openai_chunks(["Hel", "lo"])[:2], stall=30)],  # then silence
        True, rf"no data from .* for {TIMEOUT:g}s \(read timeout\)", 1),
    "disconnect mid-stream after text": (
        [Reply(chunks=(c := openai_chunks(["Hello", " world", "!"])),
               disconnect_after=len(b"".join(c[:3])) + 10)],
        True, r"connection lost mid-stream from http://127\.0\.0\.1:\d+/v1/chat/completions: "
              r".* \(not retried: part of the answer was already streamed\)$", 1),
    "disconnect mid-stream before text": (
        storm(Reply(chunks=openai_chunks(["Hi"]), disconnect_after=20)),
        True, rf"connection lost mid-stream from .* — still failing after {RETRIES} retries$",
        RETRIES + 1),
    "stream cut before [DONE]": (
        [Reply(chunks=openai_chunks(["Hello"])[:2], framing="close")],
        True, r"connection lost mid-stream from .* \(the stream ended before \[DONE\]\)", 1),
    "malformed SSE": (
        [Reply(chunks=[b'data: {"choices": [\n\n', b"data: [DONE]\n\n"])],
        True, r"malformed stream from http://127\.0\.0\.1:\d+/v1/chat/completions: event data "
              r"is not JSON", 1),
    "malformed JSON reply": (
        [Reply(body="<html>It works!</html>", headers={"content-type": "text/html"})],
        False, r"malformed response from .*: not JSON: '<html>It works!</html>'", 1),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_provider_fault_ends_the_turn_with_a_clear_error(env: dict[str, str],
                                                         server: ScriptedServer,
                                                         name: str) -> None:
    replies, events, message, requests = FAULTS[name]
    server.script(TOOL_CALL, *replies, Reply(body=openai_completion("never")))
    args = ["--events"] if events else []
    r = dsh(env, "run", "-m", "openai:m", *args, "take a note")
    ledger = check_failed_run(env, r, events, message)
    assert len(server.received) == 1 + requests  # bounded: exactly retries + 1, or no retry
    assert all(x.path == "/v1/chat/completions" for x in server.received)
    results = [e for e in ledger if e["type"] == "tool/result"]
    assert [(e["name"], e["status"], e["output"]) for e in results][:1] == [
        ("note", "ok", "noted: hi")]  # the finished tool step is kept


def test_unreachable_host_names_the_url(env: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    r = dsh({**env, "OPENAI_BASE_URL": url}, "run", "-m", "openai:m", "hello")
    check_failed_run(env, r, False, rf"^openai: cannot connect to {re.escape(url)} \(.*\) — is "
                                    rf"the server running and the base_url right\? — still "
                                    rf"failing after {RETRIES} retries$")


def test_a_short_429_burst_is_retried_and_recovers(env: dict[str, str],
                                                   server: ScriptedServer) -> None:
    limited = Reply(429, {"error": {"message": "slow down"}}, {"retry-after": "0"})
    server.script(TOOL_CALL, limited, limited, Reply(body=openai_completion("all noted")))
    r = dsh(env, "run", "-m", "openai:m", "--json", "take a note")
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["output"], r.stderr) == ("all noted", "")
    assert len(server.received) == 4
    # The retried request is the same request: the history did not grow with the failures.
    assert server.received[1].body == server.received[2].body == server.received[3].body
    ledger = [json.loads(x) for x in only_session(env).read_text().splitlines()]
    assert (ledger[-1]["type"], ledger[-1]["outcome"]) == ("turn/end", "completed")
