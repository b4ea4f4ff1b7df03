"""Anthropic extended thinking and prompt caching, and the reasoning display (issue 17).

Everything runs against :class:`tests.servers.AnthropicSim`, a loopback service that applies
the Messages API's own rules: it signs the thinking blocks it returns and refuses (400
``invalid_request_error``, the API's text) a request whose assistant turn before the tool
results lost them or changed one, and it bills input by the published prompt-cache
accounting. A replay that drops, reorders or alters a thinking block fails these tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.config.loader import config_from_dict
from dsh.core.errors import ConfigError
from dsh.core.errors import InvariantViolation
from dsh.core.errors import ProviderError
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.hookspecs import hookimpl
from dsh.ledger.events import AssistantMessage
from dsh.ledger.history import Projection
from dsh.ledger.serialize import dump_event
from dsh.ledger.serialize import load_event
from dsh.llm.anthropic import AnthropicModel
from dsh.llm.anthropic import place_breakpoints
from dsh.llm.base import Model
from dsh.llm.transport import send
from dsh.run.app import App
from dsh.run.budget import request_cost
from tests.servers import AnthropicSim
from tests.servers import ScriptedServer
from tests.servers import scripted_server

MODEL = "anthropic:claude-sonnet-4-5"
KEY = "sk-ant-api03-Zq9secretKEY77"
THINKING = {"type": "enabled", "budget_tokens": 2048}
#: Thinking text with what JSON escapes, non-ASCII, and a secret-shaped token in it.
TRICKY = 'naïve → "quoted" \\ back\nline\ttab — sk-ant-api03-Leaked0000secret \u2603'
REDACTED_DATA = "EmwKAhgBEgy3va3pzix/AKIAIOSFODNN7EXAMPLE+Qq/Z8hFv9w=="
SYSTEM = "You are a careful assistant. " * 40


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    yield from scripted_server()


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


def tool_plugin(plugin_module: Callable[..., str]) -> str:
    @hookimpl
    def register_tools(register: Any) -> None:
        def read(path: str) -> str:
            """Read a file."""
            return f"contents of {path}: " + "lorem ipsum " * 60

        register(read)

    return plugin_module(register_tools=register_tools)


def sim_app(tmp_path: Path, server: ScriptedServer, plugin: str, **options: Any) -> App:
    return App(config_from_dict({
        "autoload": False, "load": [plugin], "sessions_dir": str(tmp_path / "sessions"),
        "model": MODEL, "agents": {"default": {"system": SYSTEM}},
        "models": {MODEL: {"base_url": server.url, "retries": 0,
                           "options": {"max_tokens": 8192, "thinking": THINKING, **options}}},
    }))


def loop_steps(n: int) -> list[list[tuple[Any, ...]]]:
    """``n`` steps each thinking (two blocks, the second step also redacted) and calling
    ``read``, then a final answer after a last thought."""
    steps: list[list[tuple[Any, ...]]] = []
    for i in range(n):
        step: list[tuple[Any, ...]] = [("thinking", f"step {i}: {TRICKY}" + " so on" * 30),
                                       ("thinking", f"second thought {i}")]
        if i == 1:
            step.append(("redacted", REDACTED_DATA))
        step += [("text", f"Reading f{i}."), ("tool_use", f"toolu_{i:02d}", "read",
                                               {"path": f"f{i}.txt"})]
        steps.append(step)
    steps.append([("thinking", "all read"), ("text", "FINAL ANSWER")])
    return steps


def lines(path: Path | None) -> list[dict[str, Any]]:
    assert path is not None
    return [json.loads(x) for x in path.read_text().splitlines()]


def assistant_blocks(body: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [m["content"] for m in body["messages"] if m["role"] == "assistant"]


# -- the tool loop ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_tool_loop_with_thinking_replays_every_block_exactly(
        tmp_path: Path, server: ScriptedServer, plugin_module: Any, stream: bool) -> None:
    sim = AnthropicSim(loop_steps(3))
    server.responder = sim
    app = sim_app(tmp_path, server, tool_plugin(plugin_module))
    texts: list[str] = []
    thoughts: list[str] = []
    live: list[str] = []
    watch: dict[str, Any] = {"on_text": texts.append, "on_reasoning": thoughts.append,
             "on_event": lambda e: live.append(getattr(e, "type", ""))} if stream else {}
    result = app.run("read three files", **watch)
    assert result.outcome == "completed", result.reason
    assert result.output == "FINAL ANSWER"
    assert sim.errors == []
    assert len(server.received) == 4 and result.steps == 4
    for k, got in enumerate(server.received[1:]):
        body = got.body
        assert body["stream"] is stream and body["thinking"] == THINKING
        turns = assistant_blocks(body)
        assert len(turns) == k + 1
        for i, content in enumerate(turns):  # every earlier turn: thinking first, unchanged
            issued = sim.issued[f"toolu_{i:02d}"]
            assert content[:len(issued)] == issued
            assert [b["type"] for b in content[len(issued):]] == ["text", "tool_use"]
            for block in issued:  # byte for byte in what arrived
                token = block.get("signature") or block["data"]
                assert json.dumps(token).encode() in got.raw
                if block["type"] == "thinking":
                    assert json.dumps(block["thinking"], ensure_ascii=False).encode() in got.raw
    recorded = [d for d in lines(result.path) if d["type"] == "assistant/message"]
    assert [len(d["reasoning"]) for d in recorded] == [2, 3, 2, 1]
    assert recorded[1]["reasoning"][2] == {"kind": "redacted_thinking", "provider": "anthropic",
                                           "text": "", "signature": None,
                                           "data": REDACTED_DATA, "id": None}
    assert recorded[0]["reasoning"][0]["text"] == f"step 0: {TRICKY}" + " so on" * 30
    assert all("thought" not in d["text"] and "step" not in d["text"] for d in recorded)
    if stream:
        everything = "".join(r["text"] for d in recorded for r in d["reasoning"])
        assert "".join(thoughts) == everything  # every delta, in order, nothing else
        assert "".join(texts) == "Reading f0.Reading f1.Reading f2.FINAL ANSWER"
        assert live.count("llm/reasoning") == len(thoughts) > 8
        assert not any("thought" in t or TRICKY[:5] in t for t in texts)


def test_the_simulated_api_refuses_a_replay_without_or_with_changed_thinking(
        tmp_path: Path, server: ScriptedServer, plugin_module: Any) -> None:
    """The negative control: what the loop above would get if the replay were wrong."""
    sim = AnthropicSim(loop_steps(2))
    server.responder = sim
    result = sim_app(tmp_path, server, tool_plugin(plugin_module)).run("go")
    assert result.outcome == "completed" and sim.errors == []
    good = server.received[-1].body
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}

    def post(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(server.url + "/v1/messages", json=body, headers=headers)

    def last_turn(body: dict[str, Any]) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = assistant_blocks(body)[-1]
        return content

    dropped = json.loads(json.dumps(good))
    content = last_turn(dropped)
    content[:] = [b for b in content if b["type"] not in ("thinking", "redacted_thinking")]
    reply = post(dropped)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "Expected `thinking` or `redacted_thinking`, but found `text`" in error["message"]

    for change in ("signature", "thinking"):
        altered = json.loads(json.dumps(good))
        block = last_turn(altered)[0]
        block[change] = block[change][:-1] + ("x" if block[change][-1] != "x" else "y")
        reply = post(altered)
        assert reply.status_code == 400
        assert "Invalid `signature` in `thinking` block" in reply.json()["error"]["message"]

    swapped = json.loads(json.dumps(good))
    content = last_turn(swapped)
    content[0], content[1] = content[1], content[0]
    assert post(swapped).status_code == 400  # reordered: not as returned

    # and through the adapter: a history that lost the thinking fails with the API's words
    req = ModelRequest(model=MODEL, messages=[
        Message(role="user", content="go"),
        Message(role="assistant", content="", tool_calls=(
            ToolCall(id="toolu_01", name="read", arguments={"path": "f1.txt"}),)),
        Message(role="tool", content="x", tool_call_id="toolu_01", name="read")],
        options={"max_tokens": 8192, "thinking": THINKING})
    adapter = AnthropicModel("claude-sonnet-4-5", {"base_url": server.url, "retries": 0})
    with pytest.raises(ProviderError, match="must start with a thinking block") as caught:
        send(req, model=adapter)
    assert caught.value.status == 400


def test_a_plugin_dropping_reasoning_from_the_request_is_refused(
        tmp_path: Path, server: ScriptedServer, plugin_module: Any) -> None:
    """The request chain cannot strip (or forge) thinking blocks: C3 compares them."""

    @hookimpl(wrapper=True)
    def request(call: Any) -> Any:
        req = call.request
        stripped = [attrs.evolve(m, reasoning=()) for m in req.messages]
        call.request = attrs.evolve(req, messages=stripped)
        return (yield)

    sim = AnthropicSim(loop_steps(1))
    server.responder = sim
    app = App(config_from_dict({
                       "autoload": False, "sessions_dir": str(tmp_path / "s"), "model": MODEL,
                       "load": [tool_plugin(plugin_module), plugin_module(request=request)],
                       "models": {MODEL: {"base_url": server.url, "retries": 0, "options": {
                           "max_tokens": 8192, "thinking": THINKING}}}}))
    result = app.run("go")
    assert result.outcome == "error"
    assert isinstance(result.error, InvariantViolation)
    assert "messages differ" in str(result.error)
    assert len(server.received) == 1  # the first request (no reasoning yet) went; no other


# -- replay rules ----------------------------------------------------------------------------


def test_only_anthropic_parts_are_replayed_first_and_in_order() -> None:
    parts = (
        Reasoning(kind="reasoning_content", provider="openai", text="other family"),
        Reasoning(kind="thinking", provider="anthropic", text="one", signature="sigA"),
        Reasoning(kind="reasoning", provider="openai-responses", id="rs_1", data="enc"),
        Reasoning(kind="redacted_thinking", provider="anthropic", data="opaque=="),
        Reasoning(kind="thinking", provider="anthropic", text="", signature="sigB"),
    )
    req = ModelRequest(model=MODEL, messages=[
        Message(role="user", content="q"),
        Message(role="assistant", content="answer", reasoning=parts, tool_calls=(
            ToolCall(id="t1", name="read", arguments={}),)),
        Message(role="tool", content="r", tool_call_id="t1")])
    body = AnthropicModel("m", {"base_url": "http://127.0.0.1:9"}).build_body(req, False)
    assert body["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "one", "signature": "sigA"},
        {"type": "redacted_thinking", "data": "opaque=="},
        {"type": "thinking", "thinking": "", "signature": "sigB"},
        {"type": "text", "text": "answer"},
        {"type": "tool_use", "id": "t1", "name": "read", "input": {}},
    ]
    assert "other family" not in json.dumps(body) and "enc" not in json.dumps(body)


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(st.characters(blacklist_categories=["Cs"])), min_size=1,
                      max_size=3),
       opaque=st.text(st.characters(blacklist_categories=["Cs"]), min_size=1))
def test_reasoning_survives_the_ledger_and_is_sent_byte_for_byte(texts: list[str],
                                                                 opaque: str) -> None:
    """Whatever the strings (escapes, controls, non-ASCII, secret shapes), the text,
    signature and data sent back are the ones received: through the ledger line, its
    decoding, the projection and the wire body."""
    parts = tuple(Reasoning(kind="thinking", provider="anthropic", text=t, signature=t[::-1] + "=")
                  for t in texts) + (Reasoning(kind="redacted_thinking", provider="anthropic",
                                               data=opaque),)
    event = AssistantMessage(seq=1, ts="2026-01-01T00:00:00.000Z", session="s", text="",
                             tool_calls=(ToolCall(id="c", name="t", arguments={}),),
                             reasoning=parts)
    proj = Projection()
    proj.apply_raw(json.loads(dump_event(event)))
    loaded = load_event(dump_event(event))
    assert loaded.reasoning == parts  # type: ignore[attr-defined]
    req = ModelRequest(model=MODEL, messages=proj.view())
    wire = json.dumps(AnthropicModel("m", {"base_url": "http://127.0.0.1:9"})
                      .build_body(req, False), ensure_ascii=False)
    sent = json.loads(wire)["messages"][0]["content"]
    assert sent[:-1] == [{"type": "thinking", "thinking": p.text, "signature": p.signature}
                         for p in parts[:-1]] + [{"type": "redacted_thinking", "data": opaque}]


def test_non_streamed_reply_parses_thinking_and_redacted_in_order(server: ScriptedServer) -> None:
    sim = AnthropicSim([[("redacted", "R1=="), ("thinking", "t1"), ("text", "hi"),
                         ("thinking", "t2")]])
    server.responder = sim
    adapter = AnthropicModel("claude-sonnet-4-5", {"base_url": server.url, "retries": 0})
    resp = send(ModelRequest(model=MODEL, messages=[Message(role="user", content="q")]),
                model=adapter)
    assert resp.text == "hi"
    assert resp.reasoning == (
        Reasoning(kind="redacted_thinking", provider="anthropic", data="R1=="),
        Reasoning(kind="thinking", provider="anthropic", text="t1", signature=sim.sign("t1")),
        Reasoning(kind="thinking", provider="anthropic", text="t2", signature=sim.sign("t2")))


def test_thinking_shorthand_and_a_budget_above_max_tokens(server: ScriptedServer) -> None:
    sim = AnthropicSim([[("thinking", "t"), ("text", "ok")]])
    server.responder = sim
    adapter = AnthropicModel("claude-sonnet-4-5", {"base_url": server.url, "retries": 0})
    msgs = [Message(role="user", content="q")]
    send(ModelRequest(model=MODEL, messages=msgs, options={"max_tokens": 4096,
                                                           "thinking": 1024}), model=adapter)
    assert server.received[0].body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    with pytest.raises(ConfigError, match=r"budget_tokens \(4096\) must be less than "
                                          r"max_tokens \(4096\)"):
        send(ModelRequest(model=MODEL, messages=msgs, options={"max_tokens": 4096,
                                                               "thinking": 4096}),
             model=adapter)
    with pytest.raises(ConfigError, match="option cache = 'sometimes'"):
        send(ModelRequest(model=MODEL, messages=msgs, options={"cache": "sometimes"}),
             model=adapter)
    assert len(server.received) == 1  # neither was sent


def test_switching_models_records_the_reasoning_the_new_model_does_not_get(
        tmp_path: Path, server: ScriptedServer, plugin_module: Any) -> None:
    sim = AnthropicSim(loop_steps(2))
    server.responder = sim
    app = sim_app(tmp_path, server, tool_plugin(plugin_module))
    first = app.run("go")
    assert first.outcome == "completed"
    second = app.run("and now?", session=first.session_id, model="echo")
    assert second.outcome == "completed"
    starts = [d for d in lines(first.path) if d["type"] == "turn/start"]
    assert starts[0]["reasoning_withheld"] == 0
    assert starts[1]["model"] == "echo" and starts[1]["reasoning_withheld"] == 2 + 3 + 1
    sim.steps.extend([[("thinking", "back"), ("text", "again")]])
    third = app.run("back to claude", session=first.session_id)
    assert third.outcome == "completed" and sim.errors == []
    starts = [d for d in lines(first.path) if d["type"] == "turn/start"]
    assert starts[2]["model"] == MODEL and starts[2]["reasoning_withheld"] == 0


# -- the callback plumbing -------------------------------------------------------------------


def test_on_reasoning_reaches_adapters_that_declare_it_and_spares_the_others(
        make_app: Any, plugin_module: Any) -> None:
    class Thinker(Model):
        def complete(self, request: ModelRequest, on_text: Any = None,
                     on_reasoning: Any = None) -> ModelResponse:
            if on_reasoning is not None:
                on_reasoning("hmm, ")
                on_reasoning("yes")
            if on_text is not None:
                on_text("answer")
            return ModelResponse(text="answer")

    class Old(Model):  # written before on_reasoning existed
        def complete(self, request: ModelRequest, on_text: Any = None) -> ModelResponse:
            return ModelResponse(text="old")

    @hookimpl
    def register_models(register: Any) -> None:
        register("thinker", Thinker)
        register("old", Old)

    app = make_app(load=[plugin_module(register_models=register_models)])
    got: list[str] = []
    events: list[Any] = []
    r = app.run("q", model="thinker:x", on_reasoning=got.append, on_event=events.append)
    assert (r.output, got) == ("answer", ["hmm, ", "yes"])
    assert [e.data["delta"] for e in events if getattr(e, "type", "") == "llm/reasoning"] \
        == ["hmm, ", "yes"]
    assert not [e for e in events if getattr(e, "type", "") == "llm/stream"
                and "hmm" in e.data["delta"]]
    assert app.run("q", model="old:x", on_reasoning=got.append).output == "old"


# -- prompt caching --------------------------------------------------------------------------


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _marks(body: dict[str, Any]) -> list[str]:
    found = []
    for t in body.get("tools") or []:
        if "cache_control" in t:
            found.append("tool:" + t["name"])
    if isinstance(body.get("system"), list):
        found += ["system" for b in body["system"] if "cache_control" in b]
    for i, m in enumerate(body["messages"]):
        found += [f"{i}:{m['role']}:{b['type']}" for b in m["content"] if "cache_control" in b]
    return found


def test_breakpoints_follow_the_policy_and_prefixes_stay_stable(
        tmp_path: Path, server: ScriptedServer, plugin_module: Any) -> None:
    sim = AnthropicSim(loop_steps(4))
    server.responder = sim
    app = sim_app(tmp_path, server, tool_plugin(plugin_module))
    result = app.run("read four files")
    assert result.outcome == "completed" and sim.errors == []
    bodies = [r.body for r in server.received]
    assert _marks(bodies[0]) == ["system", "0:user:text"]
    for body in bodies[1:]:
        n = len(body["messages"])
        assert _marks(body) == ["system", f"{n - 3}:user:{'text' if n == 3 else 'tool_result'}",
                                f"{n - 1}:user:tool_result"]
    for before, after in zip(bodies, bodies[1:], strict=False):
        # the stable prefix and the history are byte-identical, markers aside
        for key in ("tools", "system", "model", "thinking", "max_tokens"):
            assert _strip(after[key]) == _strip(before[key])
        assert _strip(after["messages"][:len(before["messages"])]) == \
            _strip(before["messages"])
    # the published accounting: each request reads from the cache all the previous request
    # sent (the moving breakpoint), and writes what it adds
    assert sim.usages[0]["cache_read_input_tokens"] == 0
    assert sim.usages[0]["cache_creation_input_tokens"] > 0
    for before, u in zip(sim.usages, sim.usages[1:], strict=False):
        sent_before = (before["input_tokens"] + before["cache_read_input_tokens"]
                       + before["cache_creation_input_tokens"])
        assert u["cache_read_input_tokens"] == sent_before
        assert u["cache_creation_input_tokens"] > 0 and u["input_tokens"] == 0
    recorded = [d["usage"] for d in lines(result.path) if d["type"] == "assistant/message"]
    assert recorded == [{"input_tokens": u["input_tokens"] + u["cache_read_input_tokens"]
                         + u["cache_creation_input_tokens"], "output_tokens": 20,
                         "cache_read_tokens": u["cache_read_input_tokens"],
                         "cache_write_tokens": u["cache_creation_input_tokens"]}
                        for u in sim.usages]
    assert result.usage.cache_read_tokens == sum(u["cache_read_tokens"] for u in recorded)
    assert result.usage.cache_write_tokens == sum(u["cache_write_tokens"] for u in recorded)


def test_cache_off_places_no_breakpoint_and_reads_nothing(
        tmp_path: Path, server: ScriptedServer, plugin_module: Any) -> None:
    sim = AnthropicSim(loop_steps(2))
    server.responder = sim
    app = sim_app(tmp_path, server, tool_plugin(plugin_module), cache="off")
    result = app.run("go")
    assert result.outcome == "completed"
    assert all(_marks(r.body) == [] and "cache" not in r.body for r in server.received)
    assert all(u["cache_read_input_tokens"] == 0 for u in sim.usages)
    start = next(d for d in lines(result.path) if d["type"] == "turn/start")
    assert start["options"]["cache"] == "off"  # recorded like every option (C3)


def test_cache_setting_of_the_model_and_the_tools_only_prefix(tmp_path: Path) -> None:
    adapter = AnthropicModel("m", {"base_url": "http://127.0.0.1:9", "cache": "off"})
    assert adapter.default_options()["cache"] == "off"
    with pytest.raises(ConfigError, match="cache = 'no'"):
        AnthropicModel("m", {"base_url": "http://127.0.0.1:9", "cache": "no"}).default_options()
    tools = (ToolSpec(name="a"), ToolSpec(name="b"))
    live = AnthropicModel("m", {"base_url": "http://127.0.0.1:9"})
    req = ModelRequest(model=MODEL, tools=tools, options={"cache": "auto"}, messages=[
        Message(role="user", content="q")])
    body = live.build_body(req, False)
    assert _marks(body) == ["tool:b", "0:user:text"]
    assert "cache_control" not in live.provider_tools(tools)[-1]  # the memo is untouched
    many = {"messages": [{"role": r, "content": [{"type": "text", "text": "x"}]}
                         for r in ["user", "assistant"] * 6], "system": "s",
            "tools": [{"name": "t"}]}
    assert place_breakpoints(many) == 3 <= 4


def test_cache_reads_and_writes_are_priced_at_their_own_rates() -> None:
    u = Usage(input_tokens=1_000_000, output_tokens=0, cache_read_tokens=600_000,
              cache_write_tokens=300_000)
    # input 3/M: 100k full = 0.3, 600k read at 0.1x = 0.18, 300k written at 1.25x = 1.125
    assert request_cost(u, (3.0, 15.0)) == pytest.approx(0.3 + 0.18 + 1.125)
    assert request_cost(u, (3.0, 15.0, 0.5, 4.0)) == pytest.approx(0.3 + 0.3 + 1.2)
    plain = Usage(input_tokens=1000, output_tokens=100)
    assert request_cost(plain, (3.0, 15.0)) == pytest.approx((3000 + 1500) / 1e6)


def test_cost_budget_counts_cached_tokens_cheaper(
        tmp_path: Path, server: ScriptedServer, plugin_module: Any) -> None:
    sim = AnthropicSim(loop_steps(3))
    server.responder = sim
    app = sim_app(tmp_path, server, tool_plugin(plugin_module))
    app.config.models[MODEL]["price"] = {"input": 3.0, "output": 15.0}
    seen: list[Any] = []
    result = app.run("go", context_hook=seen.append)
    assert result.outcome == "completed"
    expected = sum(request_cost(Usage(
        input_tokens=u["input_tokens"] + u["cache_read_input_tokens"]
        + u["cache_creation_input_tokens"], output_tokens=u["output_tokens"],
        cache_read_tokens=u["cache_read_input_tokens"],
        cache_write_tokens=u["cache_creation_input_tokens"]), (3.0, 15.0)) for u in sim.usages)
    full = sum((u["input_tokens"] + u["cache_read_input_tokens"]
                + u["cache_creation_input_tokens"]) * 3.0 + u["output_tokens"] * 15.0
               for u in sim.usages) / 1e6
    assert seen[0].budget.cost == pytest.approx(expected)
    assert seen[0].budget.cost < full


# -- the CLI: display, --show-reasoning, resume after SIGKILL --------------------------------


@pytest.fixture
def cli_env(tmp_path: Path, server: ScriptedServer) -> dict[str, str]:
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    (plugin_dir / "dsh_f_slow.py").write_text(
        "import os, time\n"
        "from dsh import hookimpl\n\n"
        "@hookimpl\n"
        "def register_tools(register):\n"
        "    def read(path: str) -> str:\n"
        "        '''Read a file (slowly when DSH_F_MARK is set).'''\n"
        "        mark = os.environ.get('DSH_F_MARK')\n"
        "        if mark:\n"
        "            open(mark, 'w').write('running')\n"
        "            time.sleep(60)\n"
        "        return 'contents of ' + path\n"
        "    register(read)\n")
    config = tmp_path / "dsh.toml"
    config.write_text(
        'autoload = false\nload = ["dsh_f_slow"]\n'
        f'sessions_dir = "{tmp_path / "sessions"}"\nmodel = "{MODEL}"\n'
        f'[models."{MODEL}"]\nbase_url = "{server.url}"\nretries = 0\n'
        f'price = {{input = 3.0, output = 15.0}}\n'
        f'options = {{max_tokens = 8192, thinking = 2048}}\n')
    return {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home"),
            "PYTHONPATH": os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]),
            "ANTHROPIC_API_KEY": KEY, "NO_COLOR": "1"}


def dsh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dsh", *args], env=env, text=True,
                          capture_output=True, timeout=60, stdin=subprocess.DEVNULL)


def test_show_reasoning_streams_to_stderr_never_stdout(
        server: ScriptedServer, cli_env: dict[str, str]) -> None:
    sim = AnthropicSim(loop_steps(1) + loop_steps(1) + loop_steps(1))
    server.responder = sim
    shown = dsh(cli_env, "run", "--show-reasoning", "--stream", "go")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "Reading f0.\nFINAL ANSWER\n"
    assert "step 0: naïve" in shown.stderr and "all read" in shown.stderr
    assert "sk-ant-api03-Leaked0000secret" not in shown.stderr  # redacted on the way
    quiet = dsh(cli_env, "run", "go")
    assert quiet.returncode == 0 and quiet.stdout == "FINAL ANSWER\n"
    assert "naïve" not in quiet.stderr
    as_json = dsh(cli_env, "run", "--json", "--show-reasoning", "go")
    data = json.loads(as_json.stdout)
    assert data["output"] == "FINAL ANSWER" and "naïve" not in as_json.stdout
    # the same prompt a third time: the service's cache has all of it (read, nothing written)
    assert data["usage"]["cache_read_tokens"] > 0 and data["usage"]["cache_write_tokens"] == 0
    assert "naïve" in as_json.stderr
    assert sim.errors == []


def test_sessions_show_dims_reasoning_short_and_full_and_totals_cache(
        server: ScriptedServer, cli_env: dict[str, str]) -> None:
    sim = AnthropicSim(loop_steps(2))
    server.responder = sim
    run = dsh(cli_env, "run", "--json", "go")
    session = json.loads(run.stdout)["session"]
    short = dsh(cli_env, "sessions", "show", session)
    assert short.returncode == 0, short.stderr
    out = short.stdout
    assert "∴ thinking (anthropic): step 0: naïve" in out
    assert "more; --full)" in out
    assert "∴ [redacted_thinking (anthropic), 53 bytes]" in out
    assert "sk-ant-api03-Leaked0000secret" not in out and "[redacted]" in out
    assert REDACTED_DATA not in out and sim.sign("all read") not in out
    assert "cache read" in out and "\nusage: " in out
    full = dsh(cli_env, "sessions", "show", "--full", session).stdout
    assert "    line\ttab — " in full and "more; --full)" not in full
    # the ledger itself keeps every byte (the view redacts, the record does not)
    ledger = (Path(cli_env["DSH_CONFIG"]).parent / "sessions" / f"{session}.jsonl").read_text()
    assert "sk-ant-api03-Leaked0000secret" in ledger and REDACTED_DATA in ledger


def test_resume_after_sigkill_sends_byte_identical_thinking(
        tmp_path: Path, server: ScriptedServer, cli_env: dict[str, str]) -> None:
    """Killed while the tool of a thinking step runs: the resumed request carries that
    step's thinking blocks exactly as the service sent them, or it would be refused."""
    sim = AnthropicSim([loop_steps(2)[1], [("thinking", "resumed"), ("text", "DONE")]])
    server.responder = sim
    mark = tmp_path / "running"
    proc = subprocess.Popen([sys.executable, "-m", "dsh", "run", "--stream", "go"],
                            env={**cli_env, "DSH_F_MARK": str(mark)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not mark.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the tool never ran"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (ledger_path,) = (tmp_path / "sessions").glob("*.jsonl")
    resumed = dsh(cli_env, "run", "--session", ledger_path.stem, "carry on")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == "DONE\n"
    assert sim.errors == []
    first, second = server.received
    issued = sim.issued["toolu_01"]
    assert [b["type"] for b in issued] == ["thinking", "thinking", "redacted_thinking"]
    assert assistant_blocks(second.body)[0][:3] == issued
    for block in issued:  # the very bytes the service's JSON encodes them as
        for key in ("thinking", "signature", "data"):
            if key in block:
                assert json.dumps(block[key], ensure_ascii=False).encode() in second.raw
    tool_results = [b for b in second.body["messages"][-1]["content"]
                    if b["type"] == "tool_result"]
    assert tool_results and tool_results[0]["tool_use_id"] == "toolu_01"


@pytest.mark.parametrize("stream", [True, False])
def test_runaway_thinking_is_an_error_and_nothing_is_recorded(
        tmp_path: Path, server: ScriptedServer, plugin_module: Any,
        monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    import dsh.llm.anthropic as anthropic

    monkeypatch.setattr(anthropic, "MAX_REASONING_CHARS", 500)
    sim = AnthropicSim([[("thinking", "x" * 300), ("redacted", "R" * 300), ("text", "no")]])
    server.responder = sim
    app = sim_app(tmp_path, server, tool_plugin(plugin_module))
    watch: dict[str, Any] = {"on_text": lambda _: None} if stream else {}
    result = app.run("go", **watch)
    assert result.outcome == "error"
    assert "its thinking exceeds 500 characters" in result.reason
    assert len(server.received) == 1  # not retried
    assert not [d for d in lines(result.path) if d["type"] == "assistant/message"]
