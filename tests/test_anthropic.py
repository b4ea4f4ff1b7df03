"""The Anthropic Messages adapter against a real loopback HTTP server (no mocks)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dsh.core.errors import Cancelled
from dsh.core.errors import ProviderError
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.llm.anthropic import AnthropicModel
from dsh.llm.transport import send
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import anthropic_chunks
from tests.servers import anthropic_message
from tests.servers import bytewise
from tests.servers import scripted_server
from tests.servers import sse

KEY = "sk-ant-api03-Kx7secret"
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    yield from scripted_server()


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


def make(server: ScriptedServer, **settings: Any) -> AnthropicModel:
    return AnthropicModel(
        "claude-sonnet-4-20250514", {"base_url": server.url, "retry_base": 0.001, **settings}
    )


def request(stream: bool = False, **kw: Any) -> ModelRequest:
    return ModelRequest(
        model="anthropic:claude-sonnet-4-20250514", messages=[Message(role="user", content="hi")],
        stream=stream, **kw
    )


def streamed(model: AnthropicModel, req: ModelRequest) -> tuple[ModelResponse, list[str]]:
    deltas: list[str] = []
    return send(req, on_text=deltas.append, model=model), deltas


def test_request_body_mapping(server: ScriptedServer) -> None:
    server.script(Reply(body=anthropic_message("ok")))
    req = ModelRequest(
        model="anthropic:claude-sonnet-4-20250514",
        system="Be terse.",
        messages=[
            Message(role="user", content="read a and b"),
            Message(
                role="assistant",
                content="Reading.",
                tool_calls=[
                    ToolCall(id="toolu_1", name="read", arguments={"path": "a"}),
                    ToolCall(id="toolu_2", name="read", arguments={"path": "b"}),
                ],
            ),
            Message(role="tool", content="A!", tool_call_id="toolu_1", name="read"),
            Message(
                role="tool",
                content="no such file",
                tool_call_id="toolu_2",
                name="read",
                is_error=True,
            ),
            Message(role="user", content="and now?"),  # merged into the tool results' message
            Message(role="assistant", content="Done."),
            Message(role="assistant", content="Really."),  # consecutive: merged
            Message(role="user", content=""),  # empty: dropped
            Message(role="user", content="bye"),
        ],
        tools=[
            ToolSpec(name="read", description="Read a file.", parameters=SCHEMA),
            ToolSpec(name="noop"),
        ],
        options={"temperature": 0.2, "top_k": 5},  # merged by the agent, recorded (C3)
    )
    send(req, model=make(server, options={"temperature": 1.0}))  # not merged by the adapter
    (got,) = server.received
    assert got.path == "/v1/messages"
    assert got.headers["x-api-key"] == KEY
    assert got.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in got.headers
    assert got.body == {
        "model": "claude-sonnet-4-20250514",
        "max_tokens": 4096,
        "system": "Be terse.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "read a and b"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "b"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "A!",
                        "is_error": False,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "no such file",
                        "is_error": True,
                    },
                    {"type": "text", "text": "and now?"},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Done."}, {"type": "text", "text": "Really."}],
            },
            {"role": "user", "content": [{"type": "text", "text": "bye"}]},
        ],
        "tools": [
            {"name": "read", "description": "Read a file.", "input_schema": SCHEMA},
            {"name": "noop", "input_schema": {"type": "object", "properties": {}}},
        ],
        "temperature": 0.2,
        "top_k": 5,
        "stream": False,
    }


def test_max_tokens_option_and_no_system(server: ScriptedServer) -> None:
    server.script(Reply(body=anthropic_message("ok")), Reply(body=anthropic_message("ok")))
    model = make(server, options={"max_tokens": 512})
    # recorded with the others (cache: the prompt-cache policy, issue 17)
    assert model.default_options() == {"max_tokens": 4096, "cache": "auto"}
    send(request(), model=model)  # settings' options are the agent's business, not the body's
    send(request(options={"max_tokens": 64}), model=make(server))
    assert [b["max_tokens"] for b in server.bodies] == [4096, 64]
    assert "system" not in server.bodies[0] and "tools" not in server.bodies[0]


def test_base_url_with_v1_suffix(server: ScriptedServer) -> None:
    server.script(Reply(body=anthropic_message("ok")))
    send(request(), model=AnthropicModel("c", {"base_url": server.url + "/v1/"}))
    assert server.received[0].path == "/v1/messages"


CALLS = [
    ("toolu_01A", "read", ['{"pa', 'th": "a.t', 'xt"}']),
    ("toolu_01B", "noop", []),  # no input fragments at all: input {}
    ("toolu_01C", "read", ['{"path": "b.txt"}']),
]
EXPECTED_CALLS = (
    ToolCall(id="toolu_01A", name="read", arguments={"path": "a.txt"}),
    ToolCall(id="toolu_01B", name="noop", arguments={}),
    ToolCall(id="toolu_01C", name="read", arguments={"path": "b.txt"}),
)


def test_non_streaming(server: ScriptedServer) -> None:
    calls = [("toolu_01A", "read", {"path": "a.txt"}), ("toolu_01B", "noop", {})]
    body = anthropic_message("Reading.", calls, usage=(40, 12))
    body["usage"]["cache_read_input_tokens"] = 100
    server.script(Reply(body=body))
    resp = send(request(stream=True), model=make(server))  # nobody observes: not streamed
    assert resp == ModelResponse(
        text="Reading.",
        tool_calls=EXPECTED_CALLS[:2],
        usage=Usage(input_tokens=140, output_tokens=12, cache_read_tokens=100),
        stop_reason="tool_use",
        tool_call_source="native",
        model="claude-sonnet-4-20250514",
    )
    assert server.bodies[0]["stream"] is False


@pytest.mark.parametrize("one_byte_chunks", [False, True], ids=["events", "bytewise"])
def test_streaming_equals_non_streaming(server: ScriptedServer, one_byte_chunks: bool) -> None:
    text = ["I'll ", "read ", "them: ", "naïve ☕"]
    chunks = anthropic_chunks(text, CALLS, usage=(40, 12))
    inputs = [(c.id, c.name, c.arguments) for c in EXPECTED_CALLS]
    server.script(
        Reply(chunks=bytewise(chunks) if one_byte_chunks else chunks),
        Reply(body=anthropic_message("".join(text), inputs, usage=(40, 12))),
    )
    model = make(server)
    resp, deltas = streamed(model, request(stream=True))
    assert deltas == text
    assert resp == send(request(), model=model)
    assert resp.tool_calls == EXPECTED_CALLS
    assert resp.usage == Usage(input_tokens=40, output_tokens=12)
    assert server.bodies[0]["stream"] is True


def test_overloaded_error_event_before_text_is_retried(server: ScriptedServer) -> None:
    overloaded = sse(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error"
    )
    ok = anthropic_chunks(["fine"])
    server.script(Reply(chunks=[*ok[:2], overloaded]), Reply(chunks=ok))
    resp, deltas = streamed(make(server), request(stream=True))
    assert deltas == ["fine"] and len(server.received) == 2


def test_error_event_after_text_is_not_retried(server: ScriptedServer) -> None:
    err = sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    chunks = anthropic_chunks(["partial", "more"])
    server.script(Reply(chunks=[*chunks[:4], err]), Reply(chunks=chunks))
    with pytest.raises(ProviderError, match="overloaded_error.*Overloaded.*not retried"):
        streamed(make(server), request(stream=True))
    assert len(server.received) == 1


def test_stream_without_message_stop(server: ScriptedServer) -> None:
    chunks = anthropic_chunks(["cut"], done=False)
    server.script(Reply(chunks=chunks, framing="close"))
    with pytest.raises(ProviderError, match="connection lost mid-stream.*message_stop"):
        streamed(make(server), request(stream=True))


def test_garbage_event_data(server: ScriptedServer) -> None:
    chunks = anthropic_chunks(["x"])
    server.script(Reply(chunks=[chunks[0], b"event: content_block_delta\ndata: <html>\n\n"]))
    with pytest.raises(ProviderError, match="malformed stream.*<html>"):
        streamed(make(server), request(stream=True))


def test_529_with_integer_retry_after_then_success(server: ScriptedServer) -> None:
    err = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.script(Reply(529, err, {"retry-after": "1"}), Reply(body=anthropic_message("ok")))
    t0 = time.monotonic()
    assert send(request(), model=make(server)).text == "ok"
    assert time.monotonic() - t0 >= 1.0 and len(server.received) == 2


def test_529_forever(server: ScriptedServer) -> None:
    err = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.script(*[Reply(529, err) for _ in range(3)])
    with pytest.raises(ProviderError, match=r"overloaded \(HTTP 529\): Overloaded.*2 retries"):
        send(request(), model=make(server, retries=2))
    assert len(server.received) == 3


def test_401_names_the_variable(server: ScriptedServer) -> None:
    err = {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
    }
    server.script(Reply(401, err))
    with pytest.raises(ProviderError, match="authentication failed.*ANTHROPIC_API_KEY") as info:
        send(request(), model=make(server))
    assert KEY not in str(info.value) and "invalid x-api-key" in str(info.value)


def test_missing_key_is_found_before_any_request(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    model = make(server)  # even on loopback: only the OpenAI adapter waives the key
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
        model.check()
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY"):
        send(request(), model=model)
    assert server.received == []


def test_prompt_too_long(server: ScriptedServer) -> None:
    err = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 208310 tokens > 200000 maximum",
        },
    }
    server.script(Reply(400, err))
    with pytest.raises(ProviderError, match="context too long.*208310 tokens") as info:
        send(request(), model=make(server))
    assert info.value.status == 400 and len(server.received) == 1


def test_unknown_model(server: ScriptedServer) -> None:
    err = {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-nope"}}
    server.script(Reply(404, err))
    with pytest.raises(ProviderError, match=f"unknown model 'claude-nope' at {server.url}"):
        send(request(), model=make(server, model="claude-nope"))


def test_abort_mid_stream(server: ScriptedServer) -> None:
    chunks = anthropic_chunks(["Hello", " world"])
    server.script(Reply(chunks=chunks[:4], stall=30))
    ctx = RunContext(run_id="t", agent="a", ledger=None)  # type: ignore[arg-type]
    deltas: list[str] = []
    def on_text(text: str) -> None:  # cancelled once text arrived: a condition, not a time
        deltas.append(text)
        ctx.cancel.cancel()

    with activate(ctx):
        t0 = time.monotonic()
        with pytest.raises(Cancelled):
            send(request(stream=True), on_text=on_text, model=make(server))
        elapsed = time.monotonic() - t0
    assert elapsed < 15 and deltas == ["Hello"]  # not the 30 s stall
    assert ctx.run_cleanups() == []
