"""Compaction on small windows (issue 26): it always shrinks, always fits, and a turn a retry
would save never fails.

The model is a real loopback HTTP server speaking the OpenAI protocol that behaves like
llama.cpp's at a small ``n_ctx``: it counts each prompt with dsh's own estimator scaled by a
"tokenizer ratio" (so dsh's estimate is wrong by a known factor until it calibrates), refuses
a prompt of ``n_ctx`` tokens or more with llama.cpp's error, reports ``usage``, honours
``max_tokens``, and answers a summary request (recognised by dsh's summary system prompt) with
a summary of the length the test chooses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.core.messages import Message
from dsh.core.messages import ToolCall
from dsh.hookspecs import hookimpl
from dsh.ledger.history import Projection
from dsh.run import compaction
from dsh.run.compaction import CompactionRequest
from dsh.run.compaction import estimate_tokens
from dsh.run.compaction.trigger import MAX_REFUSALS
from tests.servers import Received
from tests.servers import Reply
from tests.servers import ScriptedServer
from tests.servers import openai_completion
from tests.servers import scripted_server

PROMPT = ("Turn {i}. Here is a note to remember, about the weather, the garden and the old "
          "bicycle in the shed: it rained on Monday and the roses need water. Reply briefly.")


class SmallWindow:
    """A llama.cpp-like server at ``n_ctx`` tokens (see the module docstring)."""

    def __init__(self, n_ctx: int = 512, ratio: float = 1.0, answer: int = 150,
                 summary: str = "short", tool_every: int = 0,
                 tools_ratio: float | None = None) -> None:
        self.n_ctx, self.ratio, self.answer = n_ctx, ratio, answer
        self.tools_ratio = ratio if tools_ratio is None else tools_ratio
        self.summary, self.tool_every = summary, tool_every
        #: (kind, prompt tokens, max_tokens, refused) of every request, in order.
        self.log: list[tuple[str, int, int | None, bool]] = []
        self.turns = 0

    def count(self, body: dict[str, Any]) -> int:
        """dsh's estimate of the messages times ``ratio``, of the tool schemas (as sent)
        times ``tools_ratio``."""
        tools = math.ceil(self.tools_ratio * estimate_tokens(
            json.dumps(body.get("tools") or [], ensure_ascii=False)))
        raw = 0
        for m in body["messages"]:
            content = m.get("content") or ""
            raw += 4 + estimate_tokens(content if isinstance(content, str) else
                                       json.dumps(content))
            for c in m.get("tool_calls") or ():
                raw += estimate_tokens(c["function"]["name"] + c["function"]["arguments"])
        return tools + math.ceil(raw * self.ratio)

    def __call__(self, received: Received) -> Reply:
        body = received.body
        if received.method != "POST":
            return Reply(404, {"error": {"message": "not found"}})
        system = body["messages"][0].get("content") if body["messages"] else ""
        kind = "summary" if system == compaction.SUMMARY_SYSTEM else "chat"
        n, cap = self.count(body), body.get("max_tokens")
        refused = n >= self.n_ctx
        self.log.append((kind, n, cap, refused))
        if refused:
            return Reply(400, {"error": {
                "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": n,
                "n_ctx": self.n_ctx,
                "message": "the request exceeds the available context size, try increasing "
                           "it"}})
        if kind == "summary":
            text = body["messages"][-1]["content"]
            out = ("Summary: the user keeps notes about rain and roses. " if
                   self.summary == "short" else text + " " + text)
        else:
            self.turns += 1
            last = body["messages"][-1]
            if self.tool_every and last["role"] == "user" and self.turns % self.tool_every == 0:
                args = json.dumps({"path": "notes.txt"})
                return Reply(200, openai_completion(None, [(f"c{self.turns}", "read_file",
                                                            args)], usage=(n, 12)))
            out = f"answer {self.turns}: " + "the roses need water; " * (self.answer // 22)
        if cap and not (kind == "summary" and self.summary == "long"):
            # A hard max_tokens cuts the answer, as the server would (the "long" summaries
            # come from a server that ignores it: the guard is the last safety).
            out = out[: max(1, int(cap * 3 / self.ratio))]
        tokens = math.ceil(estimate_tokens(out) * self.ratio)
        return Reply(200, openai_completion(out, usage=(n, tokens)))


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    yield from scripted_server()


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _compactions(path: Path) -> list[dict[str, Any]]:
    return [d for d in _lines(path) if d["type"] == "context/compacted"]


def _app(make_app: Any, server: ScriptedServer, sim: SmallWindow, **kw: Any) -> Any:
    server.responder = sim
    model = {"base_url": server.url + "/v1", "retries": 0, "context_window": sim.n_ctx,
             "options": {"max_tokens": 96}}
    return make_app(model="openai:small", models={"openai:small": model}, **kw)


#: What a person gives a 512-token model: the workbench's three basic tools (its twelve
#: schemas together, about 2,900 tokens, are five times the window).
SMALL_TOOLS = ["run_command", "read_file", "write_file"]


def _shell(make_app: Any, server: ScriptedServer, sim: SmallWindow, tmp_path: Path,
           **kw: Any) -> Any:
    """The default agent with dsh-shell's tools on (its workspace a scratch directory)."""
    (tmp_path / "notes.txt").write_text("rain on Monday; roses; the old bicycle\n" * 3)
    return _app(make_app, server, sim, load=["dsh_shell"],
                plugins={"shell": {"workspace": str(tmp_path)}},
                agents={"default": {"tools": SMALL_TOOLS}}, **kw)


def _fresh(path: Path) -> list[Message]:
    from dsh.ledger.serialize import load_event

    p = Projection()
    for line in path.read_text().splitlines():
        p.apply(load_event(line))
    return list(p.view())


@pytest.mark.parametrize(("tools", "ratio", "summary"), [
    (0.5, 0.6, "short"), (0.5, 1.2, "short"), (0.55, 0.7, "long"), (0.45, 1.3, "long")])
def test_thirty_turns_at_512_every_turn_answers_and_every_compaction_shrank(
        make_app: Any, server: ScriptedServer, tmp_path: Path, tools: float, ratio: float,
        summary: str) -> None:
    # dsh-shell's three tool schemas take most of the window. The server counts them at
    # about half dsh's estimate (JSON tokenizes well) and the conversation at 0.6-1.3 times
    # it: one calibration ratio cannot be exact for both. A "long" summary repeats its input
    # twice: it must be discarded, and the last resort must take over.
    sim = SmallWindow(ratio=ratio, tools_ratio=tools, summary=summary, tool_every=4)
    app = _shell(make_app, server, sim, tmp_path)
    with app.session() as s:
        results = [s.send(PROMPT.format(i=i)) for i in range(1, 31)]
    bad = [(i, r.outcome, r.reason) for i, r in enumerate(results, 1) if r.outcome != "completed"]
    assert not bad
    assert all(r.output.strip() for r in results)
    path = results[-1].path
    comps = _compactions(path)
    assert comps, "30 turns at n_ctx 512 must have needed compaction"
    for c in comps:
        assert c["tokens_after"] < c["tokens_before"], c
    # No summary request was ever refused: each fitted, with its hard max_tokens.
    summaries = [x for x in sim.log if x[0] == "summary"]
    assert all(not refused and cap for _, _, cap, refused in summaries)
    if summary == "long":
        assert not [c for c in comps if c["strategy"] == "summarize"]
        assert any(c["strategy"] == "truncate" for c in comps)
    # Every call keeps its result; the newest user message is what the model saw last.
    msgs = _fresh(path)
    assert {c.id for m in msgs for c in m.tool_calls} == {
        m.tool_call_id for m in msgs if m.role == "tool"}
    assert any(m.role == "user" and "Turn 30." in m.content for m in msgs)
    # The estimate was calibrated by the server's counts, and that is in the ledger.
    calibrations = [d for d in _lines(path) if d["type"] == "x/dsh.compaction/calibration"]
    assert calibrations
    # Resuming after the last turn works and projects the same history.
    with app.session(session_id=results[-1].session_id) as s:
        assert list(s.ledger.projection.view()) == msgs
        assert compaction.meter_of(s.ledger).ratio == pytest.approx(
            compaction.estimate.ratio_of(calibrations[-1]["data"]["reported"],
                                         calibrations[-1]["data"]["estimated"]))
        again = s.send("One more: what did I say about the roses?")
    assert again.outcome == "completed", again.reason


def test_calibration_lets_the_threshold_fire_before_the_provider_refuses(
        make_app: Any, server: ScriptedServer, tmp_path: Path) -> None:
    # The server counts 30% more than dsh estimates: after the first answer's usage, dsh
    # counts as the server does and compacts in time, so later turns are never refused.
    sim = SmallWindow(ratio=1.3)
    app = _app(make_app, server, sim)
    with app.session() as s:
        results = [s.send(PROMPT.format(i=i)) for i in range(1, 21)]
    assert all(r.outcome == "completed" for r in results), [r.reason for r in results]
    chat = [x for x in sim.log if x[0] == "chat"]
    assert not any(refused for *_, refused in chat[2:])
    assert all(n + 96 <= sim.n_ctx for _, n, _, refused in chat if not refused)


def test_a_summary_longer_than_its_input_is_discarded_and_nothing_grew(
        make_app: Any, server: ScriptedServer) -> None:
    sim = SmallWindow(summary="long")
    app = _app(make_app, server, sim, compaction="summarize")
    with app.session() as s:
        results = [s.send(PROMPT.format(i=i)) for i in range(1, 12)]
    assert all(r.outcome == "completed" for r in results), [r.reason for r in results]
    comps = _compactions(results[-1].path)
    assert [x for x in sim.log if x[0] == "summary"], "a summary was asked for"
    assert comps and {c["strategy"] for c in comps} == {"truncate"}
    assert all(c["tokens_after"] < c["tokens_before"] for c in comps)


def test_a_long_history_is_summarised_in_chunks_that_each_fit(
        make_app: Any, server: ScriptedServer) -> None:
    sim = SmallWindow(n_ctx=1024, answer=600)
    app = _app(make_app, server, sim, compaction="summarize", compact_at=0.95)
    with app.session() as s:
        results = [s.send(PROMPT.format(i=i) + " " + "w" * 200) for i in range(1, 9)]
    assert all(r.outcome == "completed" for r in results), [r.reason for r in results]
    comps = [c for c in _compactions(results[-1].path) if c["strategy"] == "summarize"]
    assert comps
    summaries = [x for x in sim.log if x[0] == "summary"]
    assert len(summaries) > len(comps), "some summary took more than one request"
    assert all(cap is not None and n + cap <= sim.n_ctx for _, n, cap, _ in summaries)
    # The later pieces carried the summary so far.
    bodies = [r.body for r in server.received
              if r.body["messages"][0].get("content") == compaction.SUMMARY_SYSTEM]
    assert any("The summary so far" in b["messages"][-1]["content"] for b in bodies)
    assert all("at most" in b["messages"][-1]["content"] for b in bodies)


def test_the_retry_after_refusals_is_bounded(make_app: Any, server: ScriptedServer) -> None:
    refusal = Reply(400, {"error": {"message": "the request exceeds the available context "
                                               "size, try increasing it",
                                    "type": "exceed_context_size_error"}})
    server.script(*[refusal] * 20)
    app = make_app(model="openai:m", compaction="mask", models={"openai:m": {
        "base_url": server.url + "/v1", "retries": 0, "context_window": 4000}})
    with app.session() as s:
        r = s.send("hello")
    assert r.outcome == "error" and "context" in r.reason
    assert 1 < len(server.received) <= MAX_REFUSALS + 1


def test_a_user_message_larger_than_the_window_names_itself_and_its_size(
        make_app: Any, server: ScriptedServer) -> None:
    sim = SmallWindow()
    app = _app(make_app, server, sim)
    with app.session() as s:
        assert s.send("hello").outcome == "completed"
        big = s.send("x " * 2000)
        assert big.outcome == "error"
        assert "the newest user message is about" in big.reason and "512 tokens" in big.reason
        small = s.send("and now a small one")
    assert small.outcome == "completed", small.reason


def test_a_system_prompt_too_large_for_the_window_says_so(
        make_app: Any, server: ScriptedServer) -> None:
    sim = SmallWindow()
    app = _app(make_app, server, sim, agent="big", agents={"big": {"system": "rules. " * 700}})
    with app.session() as s:
        r = s.send("hi")
    assert r.outcome == "error"
    assert "window (512 tokens" in r.reason


def test_the_guard_compares_what_is_recorded(make_app: Any, script: Any,
                                             plugin_module: Any) -> None:
    """A compaction that does not shrink the calibrated estimate is not recorded; one that
    does is recorded with exactly the before and after the guard compared."""
    grow = {"on": True}

    @hookimpl(tryfirst=True)
    def compact_context(request: CompactionRequest) -> Any:
        if grow["on"]:  # "summarise" the first message into something longer
            first = request.messages[0]
            return compaction.Compaction(start=0, end=1, strategy="grow", replacement=(
                Message(role="user", content=first.content * 2),))
        return None

    app = make_app(load=[plugin_module(compact_context=compact_context)], context_window=300,
                   model=script(*[{"text": "a" * 300}] * 8))
    with app.session() as s:
        s.send("q" * 300)
        path = s.send("r" * 300).path
        ledger = s.ledger
        proj = ledger.projection
        meter = compaction.meter_of(ledger)
        n = len(_compactions(path))
        compaction.compact_now(app.agent(), ledger, None, reason="manual", strategy="grow")
        assert not [c for c in _compactions(path) if c["strategy"] == "grow"]
        assert len(_compactions(path)) == n
        grow["on"] = False
        before = meter.estimate(proj)
        event = compaction.compact_now(app.agent(), ledger, None, reason="manual",
                                       strategy="truncate")
        assert event is not None and event.strategy == "truncate"
        assert event.tokens_before == before
        assert event.tokens_after == meter.estimate(proj) < before


def _history(draw: Any) -> list[Message]:
    msgs: list[Message] = []
    n = draw(st.integers(1, 12))
    for k in range(n):
        kind = draw(st.sampled_from(["user", "answer", "calls"]))
        size = draw(st.integers(0, 400))
        if kind == "user":
            msgs.append(Message(role="user", content="u" * size))
        elif kind == "answer":
            msgs.append(Message(role="assistant", content="a" * size))
        else:
            calls = tuple(ToolCall(id=f"c{k}-{j}", name="t", arguments={})
                          for j in range(draw(st.integers(1, 3))))
            msgs.append(Message(role="assistant", content="", tool_calls=calls))
            msgs.extend(Message(role="tool", content="r" * size, tool_call_id=c.id, name="t")
                        for c in calls)
    return msgs


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(0, 3000))
def test_truncate_keeps_tool_pairs_the_newest_user_message_and_the_latest_exchange(
        data: Any, target: int) -> None:
    msgs = _history(data.draw)
    proj = Projection()
    request = CompactionRequest(agent=None, messages=msgs, window=None, used=0, target=target,
                                reason="manual", strategy="truncate", projection=proj)
    c = compaction.truncate(request)
    if c is None:
        return
    after = compaction.apply(msgs, c)
    assert c.start == 0 and c.strategy == "truncate"
    assert request.estimate(after) < request.estimate(msgs)
    assert after[0].role == "user"  # the note, or (when it outweighs) a kept user message
    note = int("left out" in after[0].content and after[0] not in msgs)
    calls = {tc.id for m in after for tc in m.tool_calls}
    assert calls == {m.tool_call_id for m in after if m.role == "tool"}
    users = [m for m in msgs if m.role == "user"]
    if users:
        assert any(m is users[-1] for m in after)
    last = max(i for i, m in enumerate(msgs) if i == 0 or m.role != "tool")
    assert after[-(len(msgs) - last):] == msgs[last:]
    # Short of the target only when nothing but the kept exchanges is left.
    if request.estimate(after) > target:
        starts = [i for i, m in enumerate(msgs) if i == 0 or m.role != "tool"]
        ends = [*starts[1:], len(msgs)]
        newest = max((i for i in starts if msgs[i].role == "user"), default=-1)
        kept = sum(e - s for s, e in zip(starts, ends, strict=True) if s in (newest, last))
        assert len(after) == note + kept


def test_fourteen_turns_of_dsh_run_c_at_512_through_the_command_line(
        server: ScriptedServer, tmp_path: Path) -> None:
    """The issue's check, through real ``dsh run -c`` processes: the default agent with
    dsh-shell's tools on and ``-o max_tokens=96`` against the n_ctx 512 server."""
    import os
    import subprocess
    import sys

    import tomli_w

    sim = SmallWindow(ratio=0.8, tools_ratio=0.5, tool_every=5)
    server.responder = sim
    (tmp_path / "notes.txt").write_text("rain on Monday; roses; the old bicycle\n")
    config = tmp_path / "config.toml"
    config.write_text(tomli_w.dumps({
        "model": "openai:small", "autoload": False, "load": ["dsh_shell"],
        "sessions_dir": str(tmp_path / "sessions"),
        "plugins": {"shell": {"workspace": str(tmp_path)}},
        "agents": {"default": {"tools": SMALL_TOOLS}},
        "models": {"openai:small": {"base_url": server.url + "/v1", "retries": 0,
                                    "context_window": 512}}}))
    env = {**os.environ, "DSH_CONFIG": str(config), "DSH_HOME": str(tmp_path / "home")}
    for i in range(1, 15):
        args = ["run", "-o", "max_tokens=96", PROMPT.format(i=i)] + (["-c"] if i > 1 else [])
        done = subprocess.run([sys.executable, "-m", "dsh", *args], capture_output=True,
                              text=True, env=env, timeout=120, stdin=subprocess.DEVNULL,
                              check=False)
        assert done.returncode == 0, f"turn {i}: {done.stderr}"
        assert done.stdout.strip().startswith("answer"), f"turn {i}: {done.stdout!r}"
    sessions = [p for p in (tmp_path / "sessions").glob("*.jsonl")
                if sum(1 for d in _lines(p) if d["type"] == "turn/start") == 14]
    assert len(sessions) == 1
    path = sessions[0]
    comps = _compactions(path)
    assert comps and all(c["tokens_after"] < c["tokens_before"] for c in comps)
    assert all(d["outcome"] == "completed" for d in _lines(path) if d["type"] == "turn/end")
