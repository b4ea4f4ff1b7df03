"""The ``openai-responses:`` adapter (issue 17) against a loopback server that checks requests
the way the Responses API does with ``store: false`` (tests/servers_openai.py): reasoning
items must come back with their id and exact encrypted content, before the function calls of
their response — so every test here fails if the replay drops or alters one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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
from dsh.core.messages import ToolSpec
from dsh.hookspecs import hookimpl
from dsh.llm import responses as responses_module
from dsh.llm.responses import ResponsesModel
from dsh.llm.responses import reasoning_item
from dsh.llm.transport import send
from dsh.run.app import App
from dsh.run.app import RunResult
from tests.servers import Reply
from tests.servers import bytewise
from tests.servers import reconstruct
from tests.servers import sse
from tests.servers_openai import CheckingServer
from tests.servers_openai import responses_body
from tests.servers_openai import responses_events
from tests.servers_openai import responses_server

MODEL = "openai-responses:o4-mini"
URL9 = "http://127.0.0.1:9/v1"  # nothing listens: an adapter only to build bodies
KEY = "sk-test-responses-Hq3xT9secret"
#: Opaque blobs as the API returns them (base64 of encrypted bytes).
BLOB_1 = "gAAAAABoISQ24OyVRYbkYfukKzOrwPBnkuiFaEiZqVmnWjUxTRDOrMKGz3Xz" * 8
BLOB_2 = "gAAAAABoISQ3vX0mZ+K/YH1z7Q9n8lZ2pPb2cWd1eW3lHnLqXk0rQ==" * 8
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def server() -> Iterator[CheckingServer]:
    with responses_server() as s:
        yield s


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def make(server: CheckingServer, **settings: Any) -> ResponsesModel:
    return ResponsesModel("o4-mini", {"base_url": server.url + "/v1", "retries": 0,
                                      "retry_base": 0.001, **settings})


def request(stream: bool = False, messages: Any = None, **kw: Any) -> ModelRequest:
    kw.setdefault("options", {"store": False, "include": ["reasoning.encrypted_content"]})
    return ModelRequest(model=MODEL, messages=messages or [Message(role="user", content="hi")],
                        stream=stream, **kw)


def rs(rid: str, text: str, blob: str | None) -> Reasoning:
    return Reasoning(kind="reasoning", provider="openai-responses", id=rid, text=text, data=blob)


STEP_1 = [("reasoning", "rs_01a", ["**Checking the weather**\n\nI need ", "Oslo's forecast."],
           BLOB_1),
          ("function_call", "fc_01a", "call_Oslo1", "get_weather", ['{"city":', ' "Oslo"}'])]


# -- the request -----------------------------------------------------------------------------


def test_request_body_mapping(server: CheckingServer) -> None:
    server.script(Reply(body=responses_body([("message", "msg_1", ["ok"])])))
    history = [
        Message(role="user", content="weather?"),
        Message(role="assistant", content="Let me look.",
                tool_calls=[ToolCall(id="call_Oslo1", name="get_weather",
                                     arguments={"city": "Oslo"})],
                reasoning=(rs("rs_01a", "Checking", BLOB_1),
                           Reasoning(kind="thinking", provider="anthropic", text="not mine",
                                     signature="sig"),
                           Reasoning(kind="reasoning_content", provider="openai", text="nor"))),
        Message(role="tool", content="sunny", tool_call_id="call_Oslo1", name="get_weather"),
        Message(role="assistant", content="Sunny."),
        Message(role="user", content="thanks"),
    ]
    server.memory["reasoning"] = {"rs_01a": BLOB_1}  # as if it had answered step 1
    server.memory["calls"] = {"call_Oslo1": ("fc_01a", "rs_01a")}
    send(request(messages=history, system="Be terse.",
                 tools=[ToolSpec(name="get_weather", description="Weather.",
                                 parameters=WEATHER)]), model=make(server))
    (got,) = server.received
    assert got.path == "/v1/responses" and got.headers["authorization"] == f"Bearer {KEY}"
    assert server.rejected == []
    assert got.body == {
        "model": "o4-mini",
        "instructions": "Be terse.",
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather.",
                   "parameters": WEATHER, "strict": False}],
        "input": [
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "reasoning", "id": "rs_01a",
             "summary": [{"type": "summary_text", "text": "Checking"}],
             "encrypted_content": BLOB_1},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "call_Oslo1", "name": "get_weather",
             "arguments": '{"city": "Oslo"}'},
            {"type": "function_call_output", "call_id": "call_Oslo1", "output": "sunny"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Sunny."}]},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "thanks"}]},
        ],
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "stream": False,
    }


def test_default_options_keep_nothing_server_side(tmp_path: Path, server: CheckingServer) -> None:
    app = App(config_from_dict({"autoload": False, "sessions_dir": str(tmp_path), "model": MODEL,
                                "models": {MODEL: {"base_url": server.url + "/v1"}}}))
    with app.session() as s:
        assert dict(s.agent.options) == {"store": False,
                                         "include": ["reasoning.encrypted_content"]}


@pytest.mark.parametrize("key", ["instructions", "previous_response_id", "input", "tools"])
def test_options_cannot_set_the_request_or_server_side_state(tmp_path: Path,
                                                             server: CheckingServer,
                                                             key: str) -> None:
    app = App(config_from_dict({
        "autoload": False, "sessions_dir": str(tmp_path), "model": MODEL,
        "models": {MODEL: {"base_url": server.url + "/v1", "options": {key: "x"}}}}))
    with pytest.raises(ConfigError, match=f"option {key!r} cannot be set through options"):
        app.run("hi")
    assert server.received == []


def test_a_reasoning_text_item_is_sent_back_as_content() -> None:
    part = Reasoning(kind="reasoning_text", provider="openai-responses", id="rs_x", text="raw")
    assert reasoning_item(part) == {"type": "reasoning", "id": "rs_x", "summary": [],
                                    "content": [{"type": "reasoning_text", "text": "raw"}]}


# -- answers ---------------------------------------------------------------------------------


def expected_step_1() -> tuple[Reasoning, ...]:
    return (rs("rs_01a", "**Checking the weather**\n\nI need \n\nOslo's forecast.", BLOB_1),)


@pytest.mark.parametrize("split", [False, True])
def test_streamed_equals_non_streamed(server: CheckingServer, split: bool) -> None:
    items = [*STEP_1[:1], ("message", "msg_2", ["Looking ", "it up."]), STEP_1[1]]
    chunks = responses_events(items, usage=(1200, 1024, 300, 256))
    server.script(Reply(body=responses_body(items, usage=(1200, 1024, 300, 256))),
                  Reply(chunks=bytewise(chunks) if split else chunks))
    whole = send(request(), model=make(server))
    deltas: list[str] = []
    streamed = send(request(stream=True), on_text=deltas.append, model=make(server))
    assert whole == streamed
    assert "".join(deltas) == "Looking it up." == whole.text  # never the summary
    assert whole.reasoning == expected_step_1()
    assert whole.tool_calls == (ToolCall(id="call_Oslo1", name="get_weather",
                                         arguments={"city": "Oslo"}),)
    assert whole.stop_reason == "tool_calls" and whole.model == "o4-mini-2025-04-16"
    u = whole.usage
    assert (u.input_tokens, u.cache_read_tokens, u.output_tokens) == (1200, 1024, 300)


def test_a_final_event_without_output_uses_the_streamed_items(server: CheckingServer) -> None:
    items = [STEP_1[0], ("message", "msg_2", ["Hel", "lo"])]
    chunks = responses_events(items, final_output=False)
    # and one item whose output_item.done never came: completed from its deltas
    done = [c for c in chunks if b"response.output_item.done" in c]
    chunks.remove(done[-1])
    server.script(Reply(chunks=chunks))
    r = send(request(stream=True), on_text=lambda _: None, model=make(server))
    assert r.text == "Hello" and r.reasoning == (rs("rs_01a", expected_step_1()[0].text,
                                                    BLOB_1),)


def test_incomplete_names_the_reason(server: CheckingServer) -> None:
    server.script(Reply(chunks=responses_events([("message", "m", ["cut"])],
                                                end="response.incomplete")))
    r = send(request(stream=True), on_text=lambda _: None, model=make(server))
    assert r.text == "cut" and r.stop_reason == "max_output_tokens"


def test_reasoning_deltas_go_to_on_reasoning_only(server: CheckingServer) -> None:
    server.script(Reply(chunks=responses_events([STEP_1[0], ("message", "m", ["ok"])])))
    shown: list[str] = []
    thoughts: list[str] = []
    try:
        send(request(stream=True), on_text=shown.append, model=make(server),
             on_reasoning=thoughts.append)
    except TypeError:  # a core without on_reasoning: reasoning is simply not shown
        pytest.skip("this core's transport has no on_reasoning")
    assert "".join(shown) == "ok"
    assert "".join(thoughts) == "**Checking the weather**\n\nI need Oslo's forecast."


# -- errors ----------------------------------------------------------------------------------


def test_response_failed_event(server: CheckingServer) -> None:
    chunks = responses_events([("message", "m", ["x"])])[:2]
    chunks.append(sse({"type": "response.failed", "sequence_number": 2, "response": {
        "id": "resp_1", "object": "response", "status": "failed", "output": [],
        "error": {"code": "server_error", "message": "The model failed to generate a "
                                                    "response."}}}, "response.failed"))
    server.script(Reply(chunks=chunks), Reply(chunks=chunks),
                  Reply(chunks=responses_events([("message", "m", ["fine"])])))
    with pytest.raises(ProviderError, match=r"openai-responses: error from .*/v1/responses "
                                            r"\(server_error\): The model failed"):
        send(request(stream=True), on_text=lambda _: None, model=make(server))
    # nothing was shown yet: worth another try
    r = send(request(stream=True), on_text=lambda _: None, model=make(server, retries=1))
    assert r.text == "fine" and len(server.received) == 3


def test_error_event(server: CheckingServer) -> None:
    chunks = responses_events([("message", "m", ["x"])])[:1]
    chunks.append(sse({"type": "error", "code": "ERR_SOMETHING",
                       "message": "Something went wrong", "param": None,
                       "sequence_number": 1}, "error"))
    server.script(Reply(chunks=chunks))
    with pytest.raises(ProviderError, match=r"\(ERR_SOMETHING\): Something went wrong"):
        send(request(stream=True), on_text=lambda _: None, model=make(server))


def test_stream_cut_before_the_end(server: CheckingServer) -> None:
    server.script(Reply(chunks=responses_events([("message", "m", ["x"])])[:-1]),
                  Reply(chunks=responses_events([("message", "m", ["x"])])[:-1]))
    with pytest.raises(ProviderError, match=r"stream ended before response.completed"):
        send(request(stream=True), on_text=lambda _: None, model=make(server))


def test_429_then_success_and_400_named(server: CheckingServer) -> None:
    server.script(Reply(429, {"error": {"message": "Rate limit reached", "type": "requests",
                                        "code": "rate_limit_exceeded"}},
                        headers={"retry-after-ms": "5"}),
                  Reply(body=responses_body([("message", "m", ["fine"])])),
                  Reply(400, {"error": {"message": "Invalid value: 'bogus'.",
                                        "type": "invalid_request_error", "param": "x",
                                        "code": "invalid_value"}}))
    model = make(server, retries=2)
    assert send(request(), model=model).text == "fine"
    with pytest.raises(ProviderError, match=r"openai-responses: request rejected \(HTTP 400\): "
                                            r"Invalid value: 'bogus'\.$") as info:
        send(request(), model=model)
    assert info.value.status == 400 and KEY not in str(info.value)


def test_a_key_echoed_by_the_server_is_never_shown(server: CheckingServer) -> None:
    server.script(Reply(401, {"error": {"message": f"Incorrect API key provided: {KEY}.",
                                        "code": "invalid_api_key"}}))
    with pytest.raises(ProviderError) as info:
        send(request(), model=make(server))
    assert KEY not in str(info.value) and "HTTP 401" in str(info.value)
    assert "check OPENAI_API_KEY" in str(info.value)


HOSTILE: dict[str, tuple[Any, str]] = {
    "invalid JSON in an event": (
        [b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", \n\n'],
        "malformed stream .* event data is not JSON"),
    "a delta that is not text": (
        [sse({"type": "response.output_text.delta", "output_index": 0, "delta": 7})],
        "response.output_text.delta without a string delta"),
    "no output_index": (
        [sse({"type": "response.output_item.added", "item": {"type": "message"}})],
        "response.output_item.added without an output_index"),
    "a reasoning item without an id": (
        [sse({"type": "response.completed", "response": {
            "status": "completed", "output": [{"type": "reasoning", "summary": []}]}})],
        "a reasoning item without an id"),
    "encrypted content that is not text": (
        [sse({"type": "response.completed", "response": {
            "status": "completed",
            "output": [{"type": "reasoning", "id": "rs_1", "encrypted_content": {"a": 1}}]}})],
        "encrypted_content is not a string"),
    "a function call without a call_id": (
        [sse({"type": "response.completed", "response": {
            "status": "completed",
            "output": [{"type": "function_call", "name": "x", "arguments": "{}"}]}})],
        "a function_call item without a call_id"),
    "a completed event without a response": (
        [sse({"type": "response.completed"})], "response.completed without a response object"),
    "an event that is a list": ([sse([1, 2])], "an event is a list"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_streams_are_clear_errors(server: CheckingServer, case: str) -> None:
    chunks, message = HOSTILE[case]
    server.script(Reply(chunks=chunks))
    with pytest.raises(ProviderError, match=message) as info:
        send(request(stream=True), on_text=lambda _: None, model=make(server))
    assert str(info.value).startswith("openai-responses: malformed ")
    assert not info.value.retryable


def test_huge_reasoning_is_refused(server: CheckingServer,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(responses_module, "MAX_REASONING_CHARS", 5000)
    server.script(Reply(chunks=responses_events([("reasoning", "rs_1", ["z" * 6000], "b")])),
                  Reply(body=responses_body([("reasoning", "rs_1", ["s"], "b" * 6000)])))
    with pytest.raises(ProviderError, match="reasoning exceeds 5000 characters"):
        send(request(stream=True), on_text=lambda _: None, model=make(server))
    with pytest.raises(ProviderError, match="reasoning exceeds 5000 characters"):
        send(request(), model=make(server))


# -- the tool loop, end to end ------------------------------------------------------------------


def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


@hookimpl
def register_tools(register: Callable[..., None]) -> None:
    register(get_weather)


def three_steps(stream: bool = True) -> list[Reply]:
    step_2 = [("reasoning", "rs_02b", ["Now Bergen."], BLOB_2),
              ("function_call", "fc_02b", "call_Bergen2", "get_weather", ['{"city": "Bergen"}'])]
    step_3 = [("reasoning", "rs_03c", [], "gAAAAAB-final"),
              ("message", "msg_03c", ["Sunny in ", "Oslo and Bergen."])]
    if not stream:
        return [Reply(body=responses_body(s)) for s in (STEP_1, step_2, step_3)]
    return [Reply(chunks=responses_events(s)) for s in (STEP_1, step_2, step_3)]


def app_for(tmp_path: Path, server: CheckingServer, plugin: str, **model: Any) -> App:
    models = {MODEL: {"base_url": server.url + "/v1", "retries": 0, **model}}
    return App(config_from_dict({"autoload": False, "sessions_dir": str(tmp_path / "s"),
                                 "model": MODEL, "models": models, "load": [plugin]}))


def ledger_of(result: RunResult) -> Path:
    assert result.path is not None
    return result.path


def test_a_three_step_tool_loop_replays_reasoning_items(
        tmp_path: Path, server: CheckingServer, plugin_module: Callable[..., str]) -> None:
    server.script(*three_steps())
    app = app_for(tmp_path, server, plugin_module(register_tools=register_tools))
    shown: list[str] = []
    result = app.run("weather in Oslo and Bergen?", on_text=shown.append)
    assert result.outcome == "completed", result.reason
    assert server.rejected == [] and len(server.bodies) == 3
    assert result.output == "".join(shown) == "Sunny in Oslo and Bergen."
    third = server.bodies[2]["input"]
    assert [i.get("type") for i in third] == [
        "message", "reasoning", "function_call", "function_call_output",
        "reasoning", "function_call", "function_call_output"]
    rebuilt = reconstruct(ledger_of(result), ResponsesModel("x", {"base_url": URL9}),
                          stream=True)
    assert server.bodies == rebuilt  # what left is what the ledger says
    # the same items, byte for byte, in both later requests
    item = json.dumps(reasoning_item(expected_step_1()[0]), ensure_ascii=False).encode()
    assert item in server.raw[1] and item in server.raw[2]
    assert result.usage.cache_read_tokens == 0 and result.usage.input_tokens == 3 * 36


def test_the_server_refuses_a_replay_without_its_reasoning(
        tmp_path: Path, server: CheckingServer, plugin_module: Callable[..., str]) -> None:
    """The rule the loop above passes bites: the second request with its reasoning item
    removed (or altered) gets the API's 400."""
    server.script(*three_steps(stream=False)[:2])
    app = app_for(tmp_path, server, plugin_module(register_tools=register_tools))
    app.run("weather?")  # no observer: not streamed
    body = server.bodies[1]
    dropped = {**body, "input": [i for i in body["input"] if i.get("type") != "reasoning"]}
    altered = json.loads(json.dumps(body))
    altered["input"][1]["encrypted_content"] = BLOB_1[:-2] + "=="
    for sent, message in [
            (dropped, "Item 'fc_01a' of type 'function_call' was provided without its "
                      "required 'reasoning' item: 'rs_01a'."),
            (altered, "The encrypted content for item rs_01a could not be verified.")]:
        reply = httpx.post(server.url + "/v1/responses", json=sent)
        assert reply.status_code == 400
        assert reply.json()["error"]["message"] == message


def test_store_true_is_recorded_and_sent(tmp_path: Path, server: CheckingServer,
                                         plugin_module: Callable[..., str]) -> None:
    server.script(Reply(body=responses_body([("message", "m", ["ok"])])))
    app = app_for(tmp_path, server, plugin_module(register_tools=register_tools),
                  options={"store": True})
    result = app.run("hi")
    assert result.outcome == "completed", result.reason
    assert server.bodies[0]["store"] is True
    start = json.loads(ledger_of(result).read_text().splitlines()[0])
    assert start["options"]["store"] is True


# -- resume in a new process -----------------------------------------------------------------


KILLER = textwrap.dedent('''
    import os
    import signal

    from dsh import hookimpl


    def get_weather(city: str) -> str:
        """Weather for a city."""
        if os.environ.get("DIE_IN_TOOL"):
            os.kill(os.getpid(), signal.SIGKILL)  # between the reasoning step and its result
        return f"sunny in {city}"


    @hookimpl
    def register_tools(register):
        register(get_weather)
''')


def test_resume_after_sigkill_sends_byte_identical_reasoning(tmp_path: Path,
                                                            server: CheckingServer) -> None:
    (tmp_path / "killer_tools.py").write_text(KILLER)
    config = tmp_path / "dsh.toml"
    config.write_text(f'autoload = false\nsessions_dir = "{tmp_path / "s"}"\n'
                      f'load = ["killer_tools"]\nmodel = "{MODEL}"\n'
                      f'[models."{MODEL}"]\nbase_url = "{server.url}/v1"\nretries = 0\n')
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "NO_COLOR")}
    env.update(DSH_CONFIG=str(config), OPENAI_API_KEY=KEY, DIE_IN_TOOL="1",
               PYTHONPATH=os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]))
    server.script(*three_steps())
    dsh = [sys.executable, "-m", "dsh", "run"]
    first = subprocess.run([*dsh, "--stream", "weather in Oslo?"], env=env, capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert len(server.bodies) == 1
    (ledger,) = (tmp_path / "s").glob("*.jsonl")
    del env["DIE_IN_TOOL"]
    second = subprocess.run([*dsh, "--stream", "--session", ledger.stem, "go on"], env=env,
                            capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert second.returncode == 0, second.stderr
    assert server.rejected == []
    item = json.dumps(reasoning_item(expected_step_1()[0]), ensure_ascii=False).encode()
    assert item in server.raw[1]  # the encrypted reasoning, byte for byte, after the resume
    assert "Checking the weather" not in first.stdout + second.stdout  # never the answer


# -- replay is exact for any content -------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(st.text(min_size=1, max_size=40), st.none() | st.text(max_size=200),
       st.lists(st.text(max_size=60), max_size=3))
def test_any_reasoning_item_comes_back_byte_for_byte_after_the_ledger(
        rid: str, blob: str | None, summary: list[str]) -> None:
    """Whatever id, encrypted content and summary (control characters, quotes, escapes) a
    server sends, the item sent back — after the answer is written to the ledger as JSON and
    read back, as a resume does — is the one the server gave."""
    from dsh.ledger.serialize import dump_reasoning
    from dsh.ledger.serialize import raw_reasoning

    model = ResponsesModel("m", {"base_url": "http://127.0.0.1:9/v1"})
    item: dict[str, Any] = {"id": rid, "type": "reasoning",
                            "summary": [{"type": "summary_text", "text": t} for t in summary]}
    if blob is not None:
        item["encrypted_content"] = blob
    (part,) = model.parse_json({"status": "completed", "output": [item]}).reasoning
    line = json.dumps(dump_reasoning((part,)), ensure_ascii=False)
    (back,) = raw_reasoning(json.loads(line))
    sent = reasoning_item(back)
    assert json.dumps(sent, ensure_ascii=False) == json.dumps(reasoning_item(part),
                                                              ensure_ascii=False)
    assert sent["id"] == rid and sent.get("encrypted_content") == blob
    joined = "\n\n".join(summary)
    assert sent["summary"] == ([{"type": "summary_text", "text": joined}] if joined else [])


def test_a_refusal_is_the_answer_streamed_or_not(server: CheckingServer) -> None:
    item = {"id": "msg_r", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "refusal", "refusal": "I can't help with that."}]}
    events = responses_events([])[:2]
    events.append(sse({"type": "response.output_item.added", "output_index": 0,
                       "sequence_number": 2, "item": {**item, "content": []}},
                      "response.output_item.added"))
    for i, d in enumerate(["I can't ", "help with that."]):
        events.append(sse({"type": "response.refusal.delta", "item_id": "msg_r",
                           "output_index": 0, "content_index": 0, "delta": d,
                           "sequence_number": 3 + i}, "response.refusal.delta"))
    events.append(sse({"type": "response.output_item.done", "output_index": 0,
                       "sequence_number": 5, "item": item}, "response.output_item.done"))
    final = responses_body([])
    final["output"] = [item]
    events.append(sse({"type": "response.completed", "sequence_number": 6, "response": final},
                      "response.completed"))
    server.script(Reply(chunks=events), Reply(body=final))
    shown: list[str] = []
    streamed = send(request(stream=True), on_text=shown.append, model=make(server))
    whole = send(request(), model=make(server))
    assert "".join(shown) == streamed.text == whole.text == "I can't help with that."
