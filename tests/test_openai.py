"""The OpenAI-compatible adapter against a real loopback HTTP server (no mocks).

Also covers the shared transport in dsh/llm/http/: retries, timeouts, cancellation, the
per-run client and the error messages.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import attrs
import pytest

from dsh.core.errors import Cancelled
from dsh.core.errors import ConfigError
from dsh.core.errors import ProviderError
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import activate
from dsh.llm.base import INVALID_JSON_KEY
from dsh.llm.http.errors import parse_retry_after
from dsh.llm.openai import OpenAIModel
from dsh.llm.transport import send
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import bytewise
from tests.servers import closed_port
from tests.servers import openai_chunks
from tests.servers import openai_completion
from tests.servers import scripted_server
from tests.servers import sse

KEY = "sk-test-Zq8vW2secret"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    yield from scripted_server()


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("DSH_TEST_KEY", raising=False)


def make(server: ScriptedServer, **settings: Any) -> OpenAIModel:
    return OpenAIModel(
        "gpt-4o-mini", {"base_url": server.url + "/v1", "retry_base": 0.001, **settings}
    )


def request(stream: bool = False, **kw: Any) -> ModelRequest:
    return ModelRequest(
        model="openai:gpt-4o-mini",
        messages=[Message(role="user", content="hi")],
        stream=stream,
        **kw,
    )


def run_ctx() -> RunContext:
    return RunContext(run_id="t", agent="a", ledger=None)  # type: ignore[arg-type]


def streamed(model: OpenAIModel, req: ModelRequest) -> tuple[ModelResponse, list[str]]:
    deltas: list[str] = []
    return send(req, on_text=deltas.append, model=model), deltas


# -- request mapping -------------------------------------------------------------------------


def test_request_body_mapping(server: ScriptedServer) -> None:
    server.script(Reply(body=openai_completion("ok")))
    model = make(server, options={"temperature": 0.1, "max_tokens": 10})
    req = ModelRequest(
        model="openai:gpt-4o-mini",
        system="Be terse.",
        messages=[
            Message(role="user", content="weather and time?"),
            Message(
                role="assistant",
                tool_calls=[
                    ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"}),
                    ToolCall(id="call_2", name="now", arguments={}),
                ],
            ),
            Message(role="tool", content="18°C", tool_call_id="call_1", name="get_weather"),
            Message(role="tool", content="boom", tool_call_id="call_2", name="now", is_error=True),
            Message(role="assistant", content="It is 18°C."),
            Message(role="user", content="thanks"),
        ],
        tools=[
            ToolSpec(name="get_weather", description="Weather.", parameters=WEATHER),
            ToolSpec(name="now"),
        ],
        options={"temperature": 0.5},
    )
    send(req, model=model)
    (got,) = server.received
    assert got.method == "POST" and got.path == "/v1/chat/completions"
    assert got.headers["authorization"] == f"Bearer {KEY}"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["user-agent"].startswith("dsh/")
    assert got.body == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "weather and time?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "now", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18°C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "boom"},
            {"role": "assistant", "content": "It is 18°C."},
            {"role": "user", "content": "thanks"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather.",
                    "parameters": WEATHER,
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "now",
                    "description": "",
                    "parameters": {"type": "object", "properties": {}},
                },
            },
        ],
        # only the request's options: the settings' options are merged by the agent and
        # recorded on turn/start (C3), never added by the adapter on its own
        "temperature": 0.5,
        "stream": False,
    }


def test_settings_model_headers_and_no_system(server: ScriptedServer) -> None:
    server.script(Reply(body=openai_completion("ok")))
    model = make(server, model="gpt-4.1", headers={"X-Trace": "abc"})
    assert model.effective_id == "openai:gpt-4.1"  # what an agent records on turn/start
    send(attrs.evolve(request(), model=model.effective_id), model=model)
    (got,) = server.received
    assert got.body["model"] == "gpt-4.1"
    assert got.body["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in got.body
    assert got.headers["x-trace"] == "abc"


def test_base_url_from_environment(server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/custom/v1/")
    server.script(Reply(body=openai_completion("ok")))
    assert send(request(), model=OpenAIModel("m", {})).text == "ok"
    assert server.received[0].path == "/custom/v1/chat/completions"


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="timeout"):
        OpenAIModel("m", {"timeout": "soon"})
    with pytest.raises(ConfigError, match="connect_timeout"):
        OpenAIModel("m", {"connect_timeout": 0})
    with pytest.raises(ConfigError, match="retries"):
        OpenAIModel("m", {"retries": -1})
    with pytest.raises(ConfigError, match="base_url"):
        OpenAIModel("m", {"base_url": "localhost:8000"})


# -- responses -------------------------------------------------------------------------------

CALLS = [
    ("call_a", "get_weather", ['{"ci', 'ty": "Pa', 'ris"}']),
    ("call_b", "now", ["{", "}"]),
    ("call_c", "get_weather", ['{"city": "Oslo"}']),
]
EXPECTED_CALLS = (
    ToolCall(id="call_a", name="get_weather", arguments={"city": "Paris"}),
    ToolCall(id="call_b", name="now", arguments={}),
    ToolCall(id="call_c", name="get_weather", arguments={"city": "Oslo"}),
)


def test_non_streaming_text_tool_calls_and_usage(server: ScriptedServer) -> None:
    joined = [(c, n, "".join(f)) for c, n, f in CALLS]
    server.script(Reply(body=openai_completion("Let me check.", joined, usage=(120, 33))))
    # stream=True but nobody observes: no streaming (MISSION D7)
    resp = send(request(stream=True), model=make(server))
    assert resp == ModelResponse(
        text="Let me check.",
        tool_calls=EXPECTED_CALLS,
        usage=Usage(input_tokens=120, output_tokens=33),
        stop_reason="tool_calls",
        tool_call_source="native",
        model="gpt-4o-mini-2024-07-18",
    )
    body = server.received[0].body
    assert body["stream"] is False and "stream_options" not in body


@pytest.mark.parametrize("one_byte_chunks", [False, True], ids=["events", "bytewise"])
def test_streaming_equals_non_streaming(server: ScriptedServer, one_byte_chunks: bool) -> None:
    text = ["Let", " me", " check ", "☕🌍", "."]
    chunks = openai_chunks(text, CALLS, usage=(120, 33))
    joined = [(c, n, "".join(f)) for c, n, f in CALLS]
    server.script(
        Reply(chunks=bytewise(chunks) if one_byte_chunks else chunks),
        Reply(body=openai_completion("".join(text), joined, usage=(120, 33))),
    )
    model = make(server)
    resp, deltas = streamed(model, request(stream=True))
    assert deltas == text
    assert resp == send(request(), model=model)
    assert resp.tool_calls == EXPECTED_CALLS and resp.usage == Usage(
        input_tokens=120, output_tokens=33
    )
    body = server.received[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert server.received[0].headers["accept"] == "text/event-stream"


def test_invalid_tool_arguments_are_kept_raw(server: ScriptedServer) -> None:
    bad = '{"city": "Par'
    server.script(
        Reply(chunks=openai_chunks(calls=[("c1", "get_weather", [bad])])),
        Reply(body=openai_completion(None, [("c1", "get_weather", "[1, 2]")])),
    )
    model = make(server)
    resp, _ = streamed(model, request(stream=True))
    assert resp.tool_calls[0].arguments == {INVALID_JSON_KEY: bad}
    assert send(request(), model=model).tool_calls[0].arguments == {INVALID_JSON_KEY: "[1, 2]"}


def test_server_answering_json_to_a_stream_request(server: ScriptedServer) -> None:
    server.script(Reply(body=openai_completion("whole answer")))
    resp, deltas = streamed(make(server), request(stream=True))
    assert deltas == ["whole answer"] and resp.text == "whole answer"


def test_error_inside_stream(server: ScriptedServer) -> None:
    chunks = [*openai_chunks(["a"])[:2], sse({"error": {"message": "backend exploded"}})]
    server.script(Reply(chunks=chunks))
    with pytest.raises(ProviderError, match="backend exploded"):
        streamed(make(server), request(stream=True))


def test_unexpected_json_shape_is_a_provider_error(server: ScriptedServer) -> None:
    server.script(Reply(body={"choices": [{"message": "not an object"}]}))
    with pytest.raises(ProviderError, match="malformed response.*unexpected data"):
        send(request(), model=make(server))


def test_observer_errors_pass_through_untouched(server: ScriptedServer) -> None:
    server.script(Reply(chunks=openai_chunks(["a", "b"])), Reply(chunks=openai_chunks(["x"])))

    def broken(text: str) -> None:
        raise KeyError("observer broke")

    with pytest.raises(KeyError, match="observer broke"):
        send(request(stream=True), on_text=broken, model=make(server))
    assert len(server.received) == 1


# -- retries ---------------------------------------------------------------------------------


def test_429_honours_retry_after(server: ScriptedServer) -> None:
    server.script(
        Reply(
            429,
            {"error": {"message": "slow down", "code": "rate_limit_exceeded"}},
            headers={"Retry-After": "0.3"},
        ),
        Reply(body=openai_completion("done")),
    )
    t0 = time.monotonic()
    assert send(request(), model=make(server, retry_base=10)).text == "done"
    assert time.monotonic() - t0 >= 0.3
    assert len(server.received) == 2


def test_retry_after_is_capped(server: ScriptedServer) -> None:
    server.script(Reply(429, headers={"Retry-After": "3600"}), Reply(body=openai_completion("x")))
    t0 = time.monotonic()
    assert send(request(), model=make(server, max_retry_wait=0.05)).text == "x"
    assert time.monotonic() - t0 < 2


def test_parse_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after": "2"}) == 2
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < (parse_retry_after({"retry-after": date}) or 0) <= 30
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


def test_500_then_success(server: ScriptedServer) -> None:
    server.script(
        Reply(500, "oops"), Reply(502, "bad gateway"), Reply(body=openai_completion("ok"))
    )
    assert send(request(), model=make(server)).text == "ok"
    assert len(server.received) == 3


def test_500_forever_gives_up_after_bounded_retries(server: ScriptedServer) -> None:
    server.script(*[Reply(500, {"error": {"message": "internal"}}) for _ in range(10)])
    with pytest.raises(ProviderError) as info:
        send(request(), model=make(server, retries=3))
    assert len(server.received) == 4
    assert "server error (HTTP 500): internal" in str(info.value)
    assert "after 3 retries" in str(info.value) and info.value.status == 500


def test_still_rate_limited_says_so(server: ScriptedServer) -> None:
    server.script(*[Reply(429, {"error": {"message": "Rate limit reached"}}) for _ in range(3)])
    with pytest.raises(ProviderError, match=r"rate limited \(HTTP 429\).*after 2 retries"):
        send(request(), model=make(server, retries=2))
    assert len(server.received) == 3


def test_quota_exhausted_is_not_retried(server: ScriptedServer) -> None:
    err = {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
    server.script(Reply(429, err), Reply(body=openai_completion("never")))
    with pytest.raises(ProviderError, match="quota exceeded.*billing"):
        send(request(), model=make(server))
    assert len(server.received) == 1


# -- broken streams --------------------------------------------------------------------------


def test_garbage_sse_is_a_malformed_stream(server: ScriptedServer) -> None:
    server.script(Reply(chunks=[b'data: {"choices": [\n\n', b"data: [DONE]\n\n"]))
    with pytest.raises(ProviderError, match="malformed stream"):
        streamed(make(server), request(stream=True))
    assert len(server.received) == 1  # garbage is not retried


def test_disconnect_after_text_is_not_retried(server: ScriptedServer) -> None:
    chunks = openai_chunks(["Hello", " world", "!"])
    cut = len(b"".join(chunks[:3])) + 10  # role chunk and two deltas, then a torn third
    server.script(Reply(chunks=chunks, disconnect_after=cut), Reply(body=openai_completion("x")))
    with pytest.raises(ProviderError, match="connection lost mid-stream") as info:
        streamed(make(server), request(stream=True))
    assert "not retried" in str(info.value)
    assert len(server.received) == 1


def test_disconnect_before_any_text_is_retried(server: ScriptedServer) -> None:
    chunks = openai_chunks(["Hi"])
    server.script(Reply(chunks=chunks, disconnect_after=20), Reply(chunks=chunks))
    resp, deltas = streamed(make(server), request(stream=True))
    assert deltas == ["Hi"] and resp.text == "Hi"
    assert len(server.received) == 2


def test_stream_ending_without_done(server: ScriptedServer) -> None:
    chunks = openai_chunks(["Hello"])[:2]  # no finish chunk, no usage, no [DONE]
    server.script(Reply(chunks=chunks, framing="close"))
    with pytest.raises(ProviderError, match=r"connection lost mid-stream.*\[DONE\]"):
        streamed(make(server), request(stream=True))


def test_read_timeout_is_named(server: ScriptedServer) -> None:
    server.script(Reply(body=openai_completion("late"), delay=3))
    t0 = time.monotonic()
    with pytest.raises(ProviderError, match=r"0\.3s \(read timeout\)"):
        send(request(), model=make(server, timeout=0.3))
    assert time.monotonic() - t0 < 2
    assert len(server.received) == 1


def test_unreachable_server_names_the_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(ProviderError, match="cannot connect to " + url) as info:
        model = OpenAIModel("m", {"base_url": url, "retries": 1, "retry_base": 0.001})
        send(request(), model=model)
    assert "after 1 retries" in str(info.value)


# -- HTTP errors and keys --------------------------------------------------------------------


def test_401_names_the_variable_never_the_key(server: ScriptedServer) -> None:
    err = {"error": {"message": f"Incorrect API key provided: {KEY}.", "code": "invalid_api_key"}}
    server.script(Reply(401, err))
    with pytest.raises(ProviderError) as info:
        send(request(), model=make(server))
    msg = str(info.value)
    assert "authentication failed (HTTP 401)" in msg and "OPENAI_API_KEY" in msg
    assert KEY not in msg and "[redacted]" in msg and info.value.status == 401
    assert server.received[0].headers["authorization"] == f"Bearer {KEY}"
    assert len(server.received) == 1


def test_api_key_env_and_literal_key(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSH_TEST_KEY", "sk-other")
    server.script(Reply(403, "forbidden"), Reply(body=openai_completion("ok")))
    with pytest.raises(ProviderError, match="permission denied.*DSH_TEST_KEY"):
        send(request(), model=make(server, api_key_env="DSH_TEST_KEY"))
    model = make(server, api_key="sk-literal")
    assert send(request(), model=model).text == "ok"
    assert server.received[1].headers["authorization"] == "Bearer sk-literal"
    assert "sk-literal" not in repr(model)


def test_missing_key_is_found_before_any_request(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-4o-mini", {}).check()
    model = make(server, api_key_env="DSH_TEST_KEY")  # named explicitly: required even locally
    with pytest.raises(ProviderError, match="DSH_TEST_KEY"):
        model.check()
    with pytest.raises(ProviderError, match="DSH_TEST_KEY"):
        send(request(), model=model)
    assert server.received == []


def test_loopback_server_needs_no_key(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    server.script(Reply(body=openai_completion("local")))
    model = make(server)
    model.check()
    assert send(request(), model=model).text == "local"
    assert "authorization" not in server.received[0].headers


def test_unknown_model(server: ScriptedServer) -> None:
    err = {"error": {"message": "The model `gpt-9` does not exist", "code": "model_not_found"}}
    server.script(Reply(404, err), Reply(404, "404 page not found", {"content-type": "text/plain"}))
    with pytest.raises(ProviderError, match=f"unknown model 'gpt-9' at {server.url}/v1"):
        send(request(), model=make(server, model="gpt-9"))
    with pytest.raises(ProviderError, match=r"not found \(HTTP 404\) — check base_url"):
        send(request(), model=make(server))


@pytest.mark.parametrize(
    "error",
    [
        {
            "message": "This model's maximum context length is 128000 tokens.",
            "code": "context_length_exceeded",
        },
        {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
        },  # llama.cpp server
    ],
)
def test_context_too_long(server: ScriptedServer, error: dict[str, Any]) -> None:
    server.script(Reply(400, {"error": error}))
    with pytest.raises(ProviderError, match="context too long") as info:
        send(request(), model=make(server))
    assert error["message"][:30] in str(info.value)


# -- runs: shared client and cancellation ----------------------------------------------------


def test_one_client_per_run_reused_and_closed(server: ScriptedServer) -> None:
    server.script(Reply(body=openai_completion("a")), Reply(body=openai_completion("b")))
    ctx = run_ctx()
    model = make(server)
    with activate(ctx):
        assert send(request(), model=model).text == "a"
        from dsh.llm.http.client import get_client

        client = get_client()
        assert "httpx" not in ctx.resources  # the run's connection is not a swappable resource
        assert send(request(), model=make(server)).text == "b"
        assert get_client() is client
    assert server.received[0].client_port == server.received[1].client_port  # kept alive
    assert ctx.run_cleanups() == [] and client.is_closed


def _cancel_when(ctx: RunContext, ready: Callable[[], bool]) -> threading.Thread:
    """Cancel the run once ``ready()`` holds: a condition, not a time (under load a fixed
    0.2 s fired before the first chunk arrived)."""

    def wait() -> None:
        end = time.monotonic() + 60
        while not ready() and time.monotonic() < end:
            time.sleep(0.005)
        ctx.cancel.cancel()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


@pytest.mark.parametrize("where", ["before-headers", "mid-stream", "retry-wait", "reused"])
def test_abort_ends_the_request_promptly(server: ScriptedServer, where: str) -> None:
    """A cancel ends a request stalled for 30 s at once, wherever it is: before the headers,
    mid-stream, in a Retry-After wait, on a kept-alive connection. Cancelled when the server
    holds the request (or, mid-stream, when the first text arrived), so the request is
    really in flight; "at once" is judged against the 30 s stall, not as a benchmark."""
    chunks = openai_chunks(["Hello", " world"])
    stall = {
        "before-headers": Reply(chunks=chunks, delay=30),
        "mid-stream": Reply(chunks=chunks[:2], stall=30),
        "retry-wait": Reply(429, headers={"Retry-After": "30"}),
        "reused": Reply(chunks=chunks, delay=30),
    }[where]
    if where == "reused":  # the stalled request runs on a kept-alive connection
        server.script(Reply(body=openai_completion("first")))
    server.script(stall)
    ctx = run_ctx()
    model = make(server)
    deltas: list[str] = []
    with activate(ctx):
        if where == "reused":
            send(request(), model=model)
        sent = len(server.received) + 1
        canceller = _cancel_when(ctx, (lambda: bool(deltas)) if where == "mid-stream"
                                 else (lambda: len(server.received) >= sent))
        t0 = time.monotonic()
        with pytest.raises(Cancelled):
            send(request(stream=True), on_text=deltas.append, model=model)
        elapsed = time.monotonic() - t0
        canceller.join()
    assert len(server.received) == sent  # the request reached the server, and no retry did
    assert elapsed < 15  # not the 30 s stall
    assert deltas == (["Hello"] if where == "mid-stream" else [])
    ctx.run_cleanups()
    if where == "reused":
        assert server.received[0].client_port == server.received[1].client_port


def test_already_cancelled_run_sends_nothing(server: ScriptedServer) -> None:
    ctx = run_ctx()
    ctx.cancel.cancel("stop")
    with activate(ctx), pytest.raises(Cancelled):
        send(request(), model=make(server))
    assert server.received == []
    ctx.run_cleanups()


def test_non_ascii_key_is_a_clear_error_before_any_request(server: ScriptedServer,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-tést-key")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY contains non-ASCII") as info:
        make(server).check()
    assert "tést" not in str(info.value)
    assert server.received == []
