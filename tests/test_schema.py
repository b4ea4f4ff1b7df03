"""Structured output (issue 17): ``dsh run --schema`` / ``app.run(output_schema=...)``.

The schema is recorded with the turn's options (C3), sent by each provider's own mechanism
(checked on loopback servers), the answer validated on arrival, an invalid one sent back once,
then exit 1. CLI behaviour runs in real subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh.core.errors import OutputSchemaError
from dsh.core.errors import UsageError
from dsh.llm.schema import concise
from dsh.llm.schema import load
from dsh.llm.schema import problems
from dsh.run.app import App
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import anthropic_message
from tests.servers import openai_completion
from tests.servers import scripted_server

DSH = [sys.executable, "-m", "dsh"]
PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    yield from scripted_server()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "dsh.toml"
    config.write_text("autoload = false\n")
    e = {k: v for k, v in os.environ.items()
         if k not in ("NO_COLOR", "DSH_LOAD_PLUGINS") and not k.endswith("_API_KEY")}
    e.update(DSH_CONFIG=str(config), XDG_DATA_HOME=str(tmp_path / "data"))
    return e


def dsh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DSH, *args], env=env, input="", capture_output=True, text=True,
                          timeout=60)


def scripted(tmp_path: Path, *texts: str) -> str:
    path = tmp_path / f"script{len(list(tmp_path.glob('script*')))}.json"
    path.write_text(json.dumps({"responses": [{"text": t} for t in texts]}))
    return f"scripted:{path}"


def load_events(path: Path | None) -> list[dict[str, Any]]:
    assert path is not None
    return [json.loads(line) for line in path.read_text().splitlines()]


def ledger_events(env: dict[str, str], session: str) -> list[dict[str, Any]]:
    out = dsh(env, "sessions", "export", session, "--format", "jsonl")
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


# -- the concise language and loading ------------------------------------------------------------


def test_concise_matches_llm_semantics() -> None:
    assert concise("name, age int, bio: a short bio") == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "bio": {"type": "string", "description": "a short bio"}},
        "required": ["name", "age", "bio"]}
    # newlines separate fields when there are any, so descriptions may hold commas
    assert concise("score float: from 0, to 1\nok bool")["properties"] == {
        "score": {"type": "number", "description": "from 0, to 1"}, "ok": {"type": "boolean"}}


@pytest.mark.parametrize(("spec", "said"), [
    ("", "no fields"),
    ("name, age integer", "unknown type 'integer'"),
    ("name, name int", "appears twice"),
    ("full name str extra", "cannot read field"),
    ("1abc", "cannot read field"),
])
def test_concise_errors_name_the_field(spec: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        concise(spec)


_names = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)


@given(st.dictionaries(_names, st.sampled_from(["str", "int", "float", "bool"]), min_size=1,
                       max_size=6))
def test_concise_round_trips_any_field_list(fields: dict[str, str]) -> None:
    spec = ", ".join(f"{k} {v}" for k, v in fields.items())
    schema = concise(spec)
    assert list(schema["properties"]) == list(fields) == schema["required"]
    names = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
    assert all(schema["properties"][k]["type"] == names[v] for k, v in fields.items())


def test_load_reads_inline_json_files_and_mappings(tmp_path: Path) -> None:
    f = tmp_path / "person.json"
    f.write_text(json.dumps(PERSON))
    assert load(str(f)) == load(json.dumps(PERSON)) == load(PERSON) == PERSON


@pytest.mark.parametrize(("make", "said"), [
    (lambda p: str(p / "missing.json"), "missing.json: no such file"),
    (lambda p: (p / "bad.json").write_text("{oops") and str(p / "bad.json"),
     r"bad.json: not JSON"),
    (lambda p: '{"type": "array"}', "top level must be an object schema"),
    (lambda p: '{"type": "object", "properties": {"a": {"type": "strin"}}}',
     "not a valid JSON Schema: .* \\(at properties/a/type\\)"),
    (lambda p: "[1, 2]", "cannot read field"),
])
def test_bad_schemas_are_clear_usage_errors(tmp_path: Path, make: Any, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        load(make(tmp_path))


def test_problems_name_the_place_in_the_document() -> None:
    assert problems('{"name": "Ada", "age": 36}', PERSON) == ({"name": "Ada", "age": 36}, [])
    assert problems('```json\n{"name": "Ada", "age": 36}\n```', PERSON)[1] == []
    value, found = problems('{"name": "Ada", "age": "old"}', PERSON)
    assert value is None and found == ["$.age: 'old' is not of type 'integer'"]
    assert "not a JSON document" in problems("Sure! Here it is", PERSON)[1][0]
    assert "not a JSON document" in problems('Here: {"name": "Ada", "age": 1}', PERSON)[1][0]


# -- the library: recorded, validated, retried once ----------------------------------------------


def test_app_run_records_the_schema_and_returns_the_value(tmp_path: Path) -> None:
    app = App.from_config({"autoload": False, "sessions_dir": str(tmp_path / "s")})
    result = app.run("who?", model=scripted(tmp_path, '{"name": "Ada", "age": 36}'),
                     output_schema="name, age int")
    assert result.outcome == "completed" and result.value == {"name": "Ada", "age": 36}
    events = load_events(result.path)
    start = next(e for e in events if e["type"] == "turn/start")
    assert start["options"]["output_schema"] == concise("name, age int")  # in the ledger (C3)
    # the next turn without a schema records that the option is gone
    # (a scripted model answers by position in the session: the first reply was turn 1's)
    again = app.run("more", session=result.session_id,
                    model=scripted(tmp_path, "(turn 1)", "plain"))
    assert again.value is None and again.output == "plain"
    starts = [e for e in load_events(result.path) if e["type"] == "turn/start"]
    assert starts[-1]["options"] is not None and "output_schema" not in starts[-1]["options"]


def test_an_invalid_answer_is_sent_back_once_then_the_run_fails(tmp_path: Path) -> None:
    app = App.from_config({"autoload": False, "sessions_dir": str(tmp_path / "s")})
    ok = app.run("who?", model=scripted(tmp_path, "Ada, 36", '{"name": "Ada", "age": 36}'),
                 output_schema=PERSON)
    assert ok.outcome == "completed" and ok.value == {"name": "Ada", "age": 36}
    follow = [e for e in load_events(ok.path) if e["type"] == "user/message"][-1]
    assert follow["source"] == "plugin:dsh.schema" and "not a JSON document" in follow["text"]

    bad = app.run("who?", model=scripted(tmp_path, '{"name": 1}', '{"name": "Ada"}'),
                  output_schema=PERSON)
    assert bad.outcome == "error" and isinstance(bad.error, OutputSchemaError)
    assert "$: 'age' is a required property" in bad.reason
    end = [e for e in load_events(bad.path) if e["type"] == "turn/end"][-1]
    assert end["outcome"] == "error" and "output schema" in end["reason"]
    with pytest.raises(OutputSchemaError):
        bad.check()


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_stdout_is_exactly_the_json_document(env: dict[str, str], tmp_path: Path) -> None:
    model = scripted(tmp_path, 'Here you go:\n```json\n{"name": "Ada",\n "age": 36}\n```')
    out = dsh(env, "run", "-m", model, "--schema", "name, age int", "who?")
    assert out.returncode == 1  # prose around the document: sent back, then (no reply) error

    model = scripted(tmp_path, '```json\n{"name": "Ada",\n "age": 36}\n```')
    out = dsh(env, "run", "-m", model, "--schema", "name, age int", "who?")
    assert out.returncode == 0, out.stderr
    assert out.stdout == '{"name": "Ada", "age": 36}\n'
    assert json.loads(out.stdout) == {"name": "Ada", "age": 36}

    out = dsh(env, "run", "-m", model, "--schema", "name, age int", "--json", "who?")
    assert json.loads(out.stdout)["value"] == {"name": "Ada", "age": 36}


def test_cli_invalid_twice_exits_1_naming_the_problem(env: dict[str, str],
                                                      tmp_path: Path) -> None:
    model = scripted(tmp_path, '{"name": "Ada", "age": "x"}', '{"name": "Ada", "age": "y"}')
    out = dsh(env, "run", "-m", model, "--schema", "name, age int", "who?")
    assert out.returncode == 1 and out.stdout == ""
    assert "$.age: 'y' is not of type 'integer'" in out.stderr


def test_cli_bad_schema_is_exit_2_before_any_request(env: dict[str, str],
                                                     tmp_path: Path) -> None:
    out = dsh(env, "run", "-m", "echo", "--schema", str(tmp_path / "nope.json"), "hi")
    assert out.returncode == 2 and "nope.json: no such file" in out.stderr
    out = dsh(env, "run", "-m", "echo", "--schema", "a, b list", "hi")
    assert out.returncode == 2 and "unknown type 'list'" in out.stderr
    out = dsh(env, "run", "-m", "echo", "--schema", "a", "--stream", "hi")
    assert out.returncode == 2 and "--stream cannot be combined with --schema" in out.stderr
    assert not (tmp_path / "data").exists()  # nothing was written


# -- each provider's mechanism, on the wire -------------------------------------------------


def _models(tmp_path: Path, server: ScriptedServer, env: dict[str, str], **extra: str) -> None:
    lines = ["autoload = false", '[models."gpt"]', 'adapter = "openai"', 'model = "gpt-4o-mini"',
             f'base_url = "{server.url}/v1"', "retry_base = 0.001",
             '[models."resp"]', 'adapter = "openai-responses"', 'model = "gpt-5"',
             f'base_url = "{server.url}/v1"',
             '[models."claude"]', 'adapter = "anthropic"', 'model = "claude-sonnet-4-5"',
             f'base_url = "{server.url}"', 'api_key_env = "DSH_TEST_ANTHROPIC"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    Path(env["DSH_CONFIG"]).write_text("\n".join(lines) + "\n")
    env["DSH_TEST_ANTHROPIC"] = "sk-ant-test-secret"


def test_openai_sends_response_format_json_schema(server: ScriptedServer, env: dict[str, str],
                                                  tmp_path: Path) -> None:
    _models(tmp_path, server, env)
    server.script(Reply(body=openai_completion('{"name": "Ada", "age": 36}')))
    out = dsh(env, "run", "-m", "gpt", "--schema", "name, age int", "who?")
    assert out.returncode == 0, out.stderr
    assert out.stdout == '{"name": "Ada", "age": 36}\n'
    body = server.bodies[0]
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "output", "schema": concise("name, age int")}}
    assert "output_schema" not in body


def test_openai_learns_the_json_object_dialect(server: ScriptedServer, env: dict[str, str],
                                               tmp_path: Path) -> None:
    # llama-cpp-python's server: a 500 naming the literal for OpenAI's json_schema form
    refusal = {"error": {"code": 500, "type": "server_error", "message":
                         "1 validation error for CreateChatCompletionRequest\nresponse_format."
                         "type\n  Input should be 'text' or 'json_object' [type=literal_error, "
                         "input_value='json_schema', input_type=str]"}}
    _models(tmp_path, server, env)
    server.script(Reply(status=500, body=refusal),  # not retried: the dialect is learned
                  Reply(body=openai_completion('{"name": "Ada", "age": 36}')))
    out = dsh(env, "run", "-m", "gpt", "--schema", "name, age int", "who?")
    assert out.returncode == 0, out.stderr
    formats = [b["response_format"]["type"] for b in server.bodies]
    assert formats == ["json_schema", "json_object"]
    assert server.bodies[-1]["response_format"]["schema"] == concise("name, age int")


def test_openai_dialect_setting(server: ScriptedServer, env: dict[str, str],
                                tmp_path: Path) -> None:
    _models(tmp_path, server, env)
    config = Path(env["DSH_CONFIG"])
    config.write_text(config.read_text().replace(
        "retry_base = 0.001", 'retry_base = 0.001\nschema_dialect = "json_object"'))
    server.script(Reply(body=openai_completion('{"name": "Ada", "age": 36}')))
    out = dsh(env, "run", "-m", "gpt", "--schema", "name, age int", "who?")
    assert out.returncode == 0, out.stderr
    assert server.bodies[0]["response_format"] == {"type": "json_object",
                                                   "schema": concise("name, age int")}
    config.write_text(config.read_text().replace('"json_object"', '"grammar"'))
    out = dsh(env, "run", "-m", "gpt", "--schema", "name, age int", "who?")
    assert out.returncode == 2 and "schema_dialect 'grammar'" in out.stderr


def test_anthropic_forces_an_output_tool(server: ScriptedServer, env: dict[str, str],
                                         tmp_path: Path) -> None:
    _models(tmp_path, server, env)
    server.script(Reply(body=anthropic_message(
        calls=[("toolu_1", "json_answer", {"name": "Ada", "age": 36})])))
    out = dsh(env, "run", "-m", "claude", "--schema", "name, age int", "--json", "who?")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["value"] == {"name": "Ada", "age": 36}
    body = server.bodies[0]
    tool = {k: v for k, v in body["tools"][-1].items() if k != "cache_control"}
    assert len(body["tools"]) == 1 and tool == {
        "name": "json_answer", "description": tool["description"],
        "input_schema": concise("name, age int")}
    assert body["tool_choice"] == {"type": "tool", "name": "json_answer"}
    assert "output_schema" not in body
    # the answer is recorded as the assistant's text: a later turn replays it as text
    events = ledger_events(env, result["session"])
    answer = next(e for e in events if e["type"] == "assistant/message")
    assert json.loads(answer["text"]) == {"name": "Ada", "age": 36}
    assert answer["tool_calls"] == []


def test_openai_responses_sends_text_format(server: ScriptedServer, env: dict[str, str],
                                            tmp_path: Path) -> None:
    _models(tmp_path, server, env)
    answer = '{"name": "Ada", "age": 36}'
    server.script(Reply(body={
        "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant",
                    "status": "completed", "content": [
                        {"type": "output_text", "text": answer, "annotations": []}]}],
        "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": 15}}))
    out = dsh(env, "run", "-m", "resp", "--schema", "name, age int", "-o",
              'text={verbosity="low"}', "who?")
    assert out.returncode == 0, out.stderr
    assert out.stdout == '{"name": "Ada", "age": 36}\n'
    body = server.bodies[0]
    assert body["text"] == {"verbosity": "low", "format": {
        "type": "json_schema", "name": "output", "schema": concise("name, age int"),
        "strict": False}}
    assert "output_schema" not in body and "response_format" not in body
