"""How many requests a ``--schema`` run sends, counted by a loopback server.

An invalid answer is sent back once: two requests. The third one came from the OpenAI
adapter's dialect learning (llama-cpp-python's server refuses ``json_schema`` and takes
``json_object``): any error whose text held ``json_schema`` re-sent the request, even on a
server that had just taken ``json_schema``, and the re-send was outside the run's budget
(``-L requests=N``). Now it follows only that refusal, never after the server took
``json_schema``, and it reserves its place in the budget like a retry (D8).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion

#: llama-cpp-python's answer to OpenAI's json_schema form (as in tests/test_schema.py).
REFUSAL = {"error": {"code": 500, "type": "server_error", "message":
                     "1 validation error for CreateChatCompletionRequest\nresponse_format."
                     "type\n  Input should be 'text' or 'json_object' [type=literal_error, "
                     "input_value='json_schema', input_type=str]"}}


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture
def env(tmp_path: Path, server: ScriptedServer) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text(f'autoload = false\nsessions_dir = "{tmp_path / "sessions"}"\n'
                      '[models."gpt"]\nadapter = "openai"\nmodel = "gpt-4o-mini"\n'
                      f'base_url = "{server.url}/v1"\nretry_base = 0.001\n')
    return {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home"),
            "OPENAI_API_KEY": "sk-test-schema-requests", "NO_COLOR": "1"}


def dsh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", "run", "-m", "gpt", "--schema",
                           "name, age int", *args, "who?"], env=env, text=True,
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def formats(server: ScriptedServer) -> list[str]:
    return [b["response_format"]["type"] for b in server.bodies]


def test_one_schema_retry_is_two_requests(server: ScriptedServer, env: dict[str, str]) -> None:
    server.script(Reply(body=openai_completion('{"name": "Ada"}')),
                  Reply(body=openai_completion('{"name": "Ada", "age": 36}')))
    done = dsh(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"name": "Ada", "age": 36}\n'
    assert formats(server) == ["json_schema", "json_schema"]


def test_an_error_on_the_retry_sends_no_third_request(server: ScriptedServer,
                                                      env: dict[str, str]) -> None:
    # The server took json_schema for the first answer; an error naming it on the retry is
    # not the dialect refusal: the run fails with it, after two requests.
    server.script(Reply(body=openai_completion('{"name": "Ada"}')),
                  Reply(status=500, body=REFUSAL),
                  Reply(body=openai_completion('{"name": "Ada", "age": 36}')))
    done = dsh(env)
    assert done.returncode == 1, done.stderr
    assert "json_object" in done.stderr and done.stdout == ""
    assert formats(server) == ["json_schema", "json_schema"]


def test_the_learned_resend_is_a_request_of_the_budget(server: ScriptedServer,
                                                       env: dict[str, str]) -> None:
    server.script(Reply(status=500, body=REFUSAL),
                  Reply(body=openai_completion('{"name": "Ada", "age": 36}')))
    done = dsh(env, "-L", "requests=1")
    assert done.returncode == 3, done.stderr
    assert "requests" in done.stderr
    assert formats(server) == ["json_schema"]  # the limit held: nothing else left


def test_the_dialect_is_still_learned_within_the_budget(server: ScriptedServer,
                                                        env: dict[str, str]) -> None:
    server.script(Reply(status=500, body=REFUSAL),
                  Reply(body=openai_completion('{"name": "Ada"}')),
                  Reply(body=openai_completion('{"name": "Ada", "age": 36}')))
    done = dsh(env, "-L", "requests=3")
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"name": "Ada", "age": 36}\n'
    assert formats(server) == ["json_schema", "json_object", "json_object"]
