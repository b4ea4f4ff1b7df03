"""``reasoning_content`` on the OpenAI-compatible adapter (issue 17), against loopback servers
that check what the real ones check (tests/servers_openai.py): DeepSeek's thinking mode wants
a tool-call turn's reasoning back (a 400 otherwise), its deepseek-reasoner guide refuses it in
the input (a 400), vLLM 0.11+ names the field ``reasoning``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.config.loader import config_from_dict
from dsh.core.errors import ConfigError
from dsh.core.errors import ProviderError
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.hookspecs import hookimpl
from dsh.llm import openai as openai_module
from dsh.llm.openai import OpenAIModel
from dsh.llm.sse import SSEEvent
from dsh.llm.transport import send
from dsh.run.app import App
from dsh.run.app import RunResult
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import bytewise
from tests.servers import reconstruct
from tests.servers import sse
from tests.servers_openai import CheckingServer
from tests.servers_openai import deepseek_server
from tests.servers_openai import no_reasoning_rules
from tests.servers_openai import reasoning_chunks
from tests.servers_openai import reasoning_completion
from tests.test_terminal_safety import Pty

MODEL = "openai:deepseek-reasoner"
THOUGHT = ["The user wants ", "the weather. ", "I should call get_weather."]


@pytest.fixture
def server() -> Iterator[CheckingServer]:
    with deepseek_server() as s:
        yield s


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-reasoning-Zq8vW2")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def make(server: ScriptedServer, **settings: Any) -> OpenAIModel:
    return OpenAIModel("deepseek-reasoner", {"base_url": server.url + "/v1", "retries": 0,
                                             **settings})


def request(stream: bool = False, messages: Any = None, **kw: Any) -> ModelRequest:
    return ModelRequest(model=MODEL, messages=messages or [Message(role="user", content="hi")],
                        stream=stream, **kw)


def mine(text: str) -> Reasoning:
    return Reasoning(kind="reasoning_content", provider="openai", text=text)


# -- answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("split", [False, True])
def test_streamed_reasoning_is_recorded_and_never_passed_to_on_text(
        server: CheckingServer, field: str, split: bool) -> None:
    chunks = reasoning_chunks(THOUGHT, ["It is ", "sunny."], usage=(64, 40, 120, 96),
                              field=field)
    server.script(Reply(chunks=bytewise(chunks) if split else chunks))
    deltas: list[str] = []
    r = send(request(stream=True), on_text=deltas.append, model=make(server))
    assert "".join(deltas) == "It is sunny." == r.text
    assert r.reasoning == (mine("".join(THOUGHT)),)
    assert r.usage.input_tokens == 64 and r.usage.cache_read_tokens == 40
    assert r.usage.output_tokens == 120  # reasoning tokens are a part of it


def test_non_streamed_reasoning_equals_streamed(server: CheckingServer) -> None:
    server.script(Reply(body=reasoning_completion("".join(THOUGHT), "It is sunny.")),
                  Reply(chunks=reasoning_chunks(THOUGHT, ["It is sunny."])))
    whole = send(request(), model=make(server))
    streamed = send(request(stream=True), on_text=lambda _: None, model=make(server))
    assert whole.reasoning == streamed.reasoning == (mine("".join(THOUGHT)),)
    assert whole.text == streamed.text == "It is sunny."


def test_no_reasoning_field_no_part(server: CheckingServer) -> None:
    body = reasoning_completion(None, "plain")
    del body["choices"][0]["message"]["reasoning_content"]
    body["usage"] = {"prompt_tokens": 5, "completion_tokens": 1, "prompt_cache_hit_tokens": 3}
    server.script(Reply(body=body))
    r = send(request(), model=make(server))
    assert r.reasoning == () and r.text == "plain"
    assert r.usage.cache_read_tokens == 3  # DeepSeek's own name for cached prompt tokens


@pytest.mark.parametrize("value", [17, ["x"], {"summary": "x"}, None])
def test_a_reasoning_field_that_is_not_text_is_ignored(server: CheckingServer,
                                                       value: Any) -> None:
    body = reasoning_completion(None, "ok")
    body["choices"][0]["message"]["reasoning_content"] = value
    body["usage"]["prompt_tokens_details"] = {"cached_tokens": "many"}  # hostile: not a count
    server.script(Reply(body=body))
    r = send(request(), model=make(server))
    assert r.reasoning == () and r.text == "ok" and r.usage.cache_read_tokens == 0


def test_huge_reasoning_is_a_clear_error(server: CheckingServer) -> None:
    limit = openai_module.MAX_REASONING_CHARS
    server.script(Reply(body=reasoning_completion("x" * (limit + 1), "ok")))
    with pytest.raises(ProviderError, match=r"reasoning exceeds 8000000 characters") as info:
        send(request(), model=make(server))
    assert not info.value.retryable


def test_huge_streamed_reasoning_stops_the_stream(server: CheckingServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_module, "MAX_REASONING_CHARS", 1000)
    server.script(Reply(chunks=reasoning_chunks(["y" * 400] * 5, ["never"])))
    shown: list[str] = []
    with pytest.raises(ProviderError, match="reasoning exceeds 1000 characters"):
        send(request(stream=True), on_text=shown.append, model=make(server))
    assert shown == []


def test_invalid_json_in_a_reasoning_stream(server: CheckingServer) -> None:
    chunks = reasoning_chunks(THOUGHT, ["x"])
    chunks.insert(2, b'data: {"choices": [{"delta": {"reasoning_content": "unterminated\n\n')
    server.script(Reply(chunks=chunks))
    with pytest.raises(ProviderError, match="malformed stream.*not JSON"):
        send(request(stream=True), on_text=lambda _: None, model=make(server))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=8),
       st.lists(st.text(min_size=1, max_size=8), max_size=4))
def test_any_reasoning_text_is_recorded_whole_and_kept_from_the_answer(
        thought: list[str], answer: list[str]) -> None:
    """Whatever the reasoning holds (control characters, escapes, surrogates, JSON
    punctuation), it is recorded as sent, and the answer stream gets the content only."""
    model = OpenAIModel("m", {"base_url": "http://127.0.0.1:9/v1"})
    events = [SSEEvent(data=c.decode()[6:].strip())
              for c in reasoning_chunks(thought, answer)]
    shown: list[str] = []
    r = model.parse_stream(iter(events), shown.append)
    from dsh.core.sanitize import clean_text

    assert r.reasoning == (mine(clean_text("".join(thought))[0]),)
    assert "".join(shown) == "".join(answer)


# -- replay ------------------------------------------------------------------------------------


HISTORY = [
    Message(role="user", content="weather?"),
    Message(role="assistant", tool_calls=[ToolCall(id="call_1", name="get_weather",
                                                   arguments={"city": "Oslo"})],
            reasoning=(mine("need the tool"),)),
    Message(role="tool", content="sunny", tool_call_id="call_1", name="get_weather"),
    Message(role="assistant", content="Sunny.", reasoning=(mine("answer now"),)),
    Message(role="user", content="and tomorrow?"),
    Message(role="assistant", content="No idea.", reasoning=(
        mine("no tool for that"),
        Reasoning(kind="thinking", provider="anthropic", text="not mine", signature="sig"))),
    Message(role="user", content="ok"),
]


def sent_reasoning(body: dict[str, Any]) -> dict[int, str]:
    return {i: m["reasoning_content"] for i, m in enumerate(body["messages"])
            if "reasoning_content" in m}


@pytest.mark.parametrize(("policy", "expected"), [
    (None, {2: "need the tool", 4: "answer now"}),  # the default: tool_turns
    ("tool_turns", {2: "need the tool", 4: "answer now"}),
    ("none", {}),
    ("all", {2: "need the tool", 4: "answer now", 6: "no tool for that"}),
])
def test_replay_policy(policy: str | None, expected: dict[int, str]) -> None:
    model = OpenAIModel("m", {"base_url": "http://127.0.0.1:9/v1"})
    options = {} if policy is None else {"reasoning_replay": policy}
    body = model.build_body(request(messages=HISTORY, system="sys", options=options), False)
    assert sent_reasoning(body) == expected  # message 0 is the system prompt
    assert "reasoning_replay" not in body  # dsh's option, never a field of the request
    assert all("not mine" not in json.dumps(m) for m in body["messages"])


@pytest.mark.parametrize("where", ["setting", "option"])
def test_a_bad_policy_is_a_config_error(where: str) -> None:
    if where == "setting":
        model = OpenAIModel("m", {"base_url": "http://127.0.0.1:9/v1",
                                  "reasoning_replay": "sometimes"})
        with pytest.raises(ConfigError, match="`reasoning_replay` must be one of none, "
                                              "tool_turns, all, got 'sometimes'"):
            model.default_options()
    else:
        model = OpenAIModel("m", {"base_url": "http://127.0.0.1:9/v1"})
        with pytest.raises(ConfigError, match="reasoning_replay"):
            model.build_body(request(options={"reasoning_replay": True}), False)


# -- the tool loop, end to end ------------------------------------------------------------------


def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


@hookimpl
def register_tools(register: Callable[..., None]) -> None:
    register(get_weather)


def app_for(tmp_path: Path, server: ScriptedServer, plugin: str, **model: Any) -> App:
    models = {MODEL: {"base_url": server.url + "/v1", "retries": 0, **model}}
    return App(config_from_dict({"autoload": False, "sessions_dir": str(tmp_path / "s"),
                                 "model": MODEL, "models": models, "load": [plugin]}))


def ledger_of(result: RunResult) -> Path:
    assert result.path is not None
    return result.path


def three_steps() -> list[Reply]:
    return [
        Reply(body=reasoning_completion("Oslo first.", None,
                                        [("call_a1", "get_weather", '{"city": "Oslo"}')])),
        Reply(body=reasoning_completion("", None,  # thinking mode, empty reasoning: sent back
                                        [("call_b2", "get_weather", '{"city": "Bergen"}')])),
        Reply(body=reasoning_completion("Both sunny.", "Sunny in Oslo and Bergen.")),
    ]


def test_a_three_step_tool_loop_sends_reasoning_back(tmp_path: Path, server: CheckingServer,
                                                     plugin_module: Callable[..., str]) -> None:
    server.script(*three_steps())
    app = app_for(tmp_path, server, plugin_module(register_tools=register_tools))
    result = app.run("weather in Oslo and Bergen?")
    assert result.outcome == "completed", result.reason
    assert server.rejected == [] and len(server.bodies) == 3
    assert result.output == "Sunny in Oslo and Bergen."
    assert sent_reasoning(server.bodies[2]) == {1: "Oslo first.", 3: ""}  # no system prompt
    assert server.bodies == reconstruct(ledger_of(result))  # what left is what the ledger says
    recorded = [json.loads(x).get("reasoning") for x in ledger_of(result).read_text().splitlines()
                if json.loads(x)["type"] == "assistant/message"]
    assert [[r["text"] for r in parts] for parts in recorded] == [
        ["Oslo first."], [""], ["Both sunny."]]


def test_the_server_refuses_a_loop_whose_replay_drops_reasoning(
        tmp_path: Path, server: CheckingServer, plugin_module: Callable[..., str]) -> None:
    """The check the loop above passes bites: with replay off, DeepSeek's 400 ends the turn."""
    server.script(*three_steps())
    app = app_for(tmp_path, server, plugin_module(register_tools=register_tools),
                  reasoning_replay="none")
    result = app.run("weather in Oslo and Bergen?")
    assert result.outcome == "error"
    assert "request rejected (HTTP 400): The `reasoning_content` in the thinking mode must be " \
           "passed back to the API." in result.reason
    start = json.loads(ledger_of(result).read_text().splitlines()[0])
    assert start["options"] == {"reasoning_replay": "none"}  # the policy is recorded (C3)


def test_the_default_suits_the_reasoner_guide_too(tmp_path: Path,
                                                  plugin_module: Callable[..., str]) -> None:
    """deepseek-reasoner's guide: reasoning in the input is a 400. Without tool calls the
    default sends none; ``all`` would."""
    with CheckingServer(no_reasoning_rules, lambda memory, reply: None) as strict:
        strict.script(Reply(body=reasoning_completion("think 1", "one")),
                      Reply(body=reasoning_completion("think 2", "two")),
                      Reply(body=reasoning_completion("think 3", "three")))
        app = app_for(tmp_path, strict, plugin_module(register_tools=register_tools))
        first = app.run("first")
        assert first.outcome == "completed"
        assert app.run("second", session=first.session_id).outcome == "completed"
        assert strict.rejected == []
        app = app_for(tmp_path / "all", strict, plugin_module(register_tools=register_tools),
                      reasoning_replay="all")
        first = app.run("first")
        assert first.outcome == "completed"
        assert app.run("second", session=first.session_id).outcome == "error"
        assert len(strict.rejected) == 1


# -- the terminal ----------------------------------------------------------------------------


HOSTILE = "\x1b]0;owned\x07\x1b[2J\rfake prompt$ \u202e"


def test_reasoning_never_reaches_stdout_or_stderr(tmp_path: Path) -> None:
    """A real ``dsh run`` (streaming to a pipe): stdout is the answer alone; the reasoning,
    control characters included, is in the ledger only, as sent."""
    with deepseek_server() as server:
        server.script(Reply(chunks=reasoning_chunks([f"secret plan {HOSTILE}"],
                                                    ["The answer."])))
        config = tmp_path / "dsh.toml"
        config.write_text(f'autoload = false\nsessions_dir = "{tmp_path / "s"}"\n'
                          f'[models."{MODEL}"]\nbase_url = "{server.url}/v1"\nretries = 0\n')
        env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "NO_COLOR")}
        env.update(DSH_CONFIG=str(config), OPENAI_API_KEY="sk-test-reasoning-Zq8vW2")
        proc = subprocess.run([sys.executable, "-m", "dsh", "run", "--stream", "-m", MODEL,
                               "hi"], env=env, capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "The answer.\n"
        assert "secret plan" not in proc.stderr and "\x1b" not in proc.stderr
        (ledger,) = (tmp_path / "s").glob("*.jsonl")
        lines = [json.loads(x) for x in ledger.read_text().splitlines()]
        (answer,) = [x for x in lines if x["type"] == "assistant/message"]
        assert answer["reasoning"][0]["text"] == f"secret plan {HOSTILE}"
        # on a terminal, whatever shows the reasoning shows it escaped (a pipe gets it as is)
        out = Pty()
        try:
            shown = subprocess.run([sys.executable, "-m", "dsh", "sessions", "show", "--full",
                                    ledger.stem], env={**env, "NO_COLOR": "1"},
                                   stdout=out.slave, stderr=subprocess.PIPE, timeout=60,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
            text = out.take()
        finally:
            out.close()
        assert shown.returncode == 0, shown.stderr
        assert "The answer." in text and "secret plan \\x1b]0;owned\\x07" in text
        assert not set("\x1b\x07\r\u202e") & set(text), text


def test_error_event_mid_reasoning(server: CheckingServer) -> None:
    chunks = reasoning_chunks(THOUGHT, ["x"])
    chunks.insert(2, sse({"error": {"message": "model overloaded", "code": "overloaded"}}))
    server.script(Reply(chunks=chunks))
    with pytest.raises(ProviderError, match=r"openai: error from .* \(overloaded\): model "
                                            "overloaded"):
        send(request(stream=True), on_text=lambda _: None, model=make(server))


def test_reasoning_deltas_go_to_on_reasoning_only(server: CheckingServer) -> None:
    server.script(Reply(chunks=reasoning_chunks(THOUGHT, ["It is ", "sunny."])))
    shown: list[str] = []
    thoughts: list[str] = []
    try:
        send(request(stream=True), on_text=shown.append, model=make(server),
             on_reasoning=thoughts.append)
    except TypeError:  # a core without on_reasoning: reasoning is simply not shown
        pytest.skip("this core's transport has no on_reasoning")
    assert "".join(shown) == "It is sunny."
    assert "".join(thoughts) == "".join(THOUGHT)


def test_resume_after_sigkill_sends_the_same_reasoning_content(tmp_path: Path) -> None:
    """Killed between the reasoning step and its tool result, resumed in a new process: the
    next request carries the recorded reasoning_content byte for byte (DeepSeek's 400
    otherwise)."""
    from tests.test_responses import KILLER

    (tmp_path / "killer_tools.py").write_text(KILLER)
    with deepseek_server() as server:
        server.script(*three_steps()[::2])  # a tool call, then the answer
        config = tmp_path / "dsh.toml"
        config.write_text(f'autoload = false\nsessions_dir = "{tmp_path / "s"}"\n'
                          f'load = ["killer_tools"]\nmodel = "{MODEL}"\n'
                          f'[models."{MODEL}"]\nbase_url = "{server.url}/v1"\nretries = 0\n')
        env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "NO_COLOR")}
        env.update(DSH_CONFIG=str(config), OPENAI_API_KEY="sk-test-reasoning-Zq8vW2",
                   DIE_IN_TOOL="1",
                   PYTHONPATH=os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]))
        dsh = [sys.executable, "-m", "dsh", "run"]
        first = subprocess.run([*dsh, "weather in Oslo?"], env=env, capture_output=True,
                               text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert first.returncode == -9, first.stderr
        (ledger,) = (tmp_path / "s").glob("*.jsonl")
        del env["DIE_IN_TOOL"]
        second = subprocess.run([*dsh, "--session", ledger.stem, "go on"], env=env,
                                capture_output=True, text=True, timeout=60,
                                stdin=subprocess.DEVNULL)
        assert second.returncode == 0, second.stderr
        assert second.stdout == "Sunny in Oslo and Bergen.\n"
        assert server.rejected == [] and len(server.raw) == 2
        assert b'"reasoning_content": "Oslo first."' in server.raw[1]
