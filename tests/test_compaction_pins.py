"""Pins for dsh/run/compaction/ (issue 26): the exact numbers, boundaries and error paths of
the estimate, the strategies, the summary's sizing and the trigger, each checked by a fast
test (these are the tests ``python tests/mutate.py compaction`` runs against its mutants).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsh.core.errors import PluginError
from dsh.core.errors import ProviderError
from dsh.core.messages import Message
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.hookspecs import hookimpl
from dsh.ledger.history import Projection
from dsh.ledger.store import Ledger
from dsh.run import compaction
from dsh.run.compaction import Compaction
from dsh.run.compaction import CompactionRequest
from dsh.run.compaction import ContextMeter
from dsh.run.compaction import estimate
from dsh.run.compaction import strategies
from dsh.run.compaction import summary
from dsh.run.compaction import trigger


def _user(text: str) -> Message:
    return Message(role="user", content=text)


def _answer(text: str) -> Message:
    return Message(role="assistant", content=text)


def _call(cid: str, size: int = 10, name: str = "t") -> list[Message]:
    return [Message(role="assistant", content="", tool_calls=(
        ToolCall(id=cid, name=name, arguments={"a": 1}),)),
        Message(role="tool", content="r" * size, tool_call_id=cid, name=name)]


def _request(msgs: list[Message], *, target: int = 10, used: int | None = None,
             window: int | None = None, meter: ContextMeter | None = None,
             proj: Projection | None = None, strategy: str = "auto") -> CompactionRequest:
    proj = proj or Projection()
    r = CompactionRequest(agent=None, messages=msgs, window=window, used=0, target=target,
                          reason="manual", strategy=strategy, projection=proj, meter=meter)
    r.used = r.estimate(msgs) if used is None else used
    return r


# -- estimate --------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "tokens"), [
    ("", 0), ("a", 1), ("ab", 1), ("abc", 2), ("abcdef", 3), ("é", 2), ("aé", 2),
    ("aaaé", 3), ("日本", 3)])
def test_estimate_tokens_exact(text: str, tokens: int) -> None:
    assert compaction.estimate_tokens(text) == tokens


def test_message_tokens_count_overhead_content_and_tool_call_arguments() -> None:
    assert compaction.message_tokens(_user("abc")) == compaction.MESSAGE_OVERHEAD + 2
    call = Message(role="assistant", content="", tool_calls=(
        ToolCall(id="1", name="read", arguments={"path": "x" * 30}),))
    args = json.dumps({"path": "x" * 30})
    assert compaction.message_tokens(call) == (compaction.MESSAGE_OVERHEAD + 0
                                               + compaction.estimate_tokens("read")
                                               + compaction.estimate_tokens(args))
    wide = Message(role="assistant", content="", tool_calls=(
        ToolCall(id="1", name="r", arguments={"p": "é"}),))
    assert compaction.message_tokens(wide) == 4 + 1 + compaction.estimate_tokens('{"p": "é"}')


@pytest.mark.parametrize(("message", "size"), [
    ("This model's maximum context length is 8192 tokens", 8192),
    ("exceeds the context window of 512 tokens", 512),
    ("a context length of 4096", 4096),
    ("n_ctx: 384", 384), ("n_ctx=2048", 2048),
    ("the request exceeds the available context size (1024 tokens)", 1024),
    ("context size (700)", 700),
    ("prompt is too long", None), ("maximum context length is 7 tokens", None)])
def test_window_in_error(message: str, size: int | None) -> None:
    assert compaction.window_in_error(message) == size


def test_the_meter_counts_system_tools_and_messages_and_scales_by_its_ratio() -> None:
    proj = Projection()
    proj.system = "s" * 30  # 11
    proj.tools = (ToolSpec(name="t", description="d", parameters={"type": "object"}),)
    tools = json.dumps([["t", "d", {"type": "object"}]])
    meter = ContextMeter()
    fixed = 11 + compaction.estimate_tokens(tools)
    assert meter.fixed(proj) == fixed
    assert meter.estimate(proj, []) == fixed
    assert meter.estimate(proj, [_user("abc")]) == fixed + 6
    assert meter.raw(proj) == fixed == meter.used(proj)
    meter.ratio = 0.5
    assert meter.scale(7) == 4 and meter.scale(0) == 0 and meter.scale(8) == 4
    assert meter.estimate(proj, [_user("abc")]) == -(-(fixed + 6) // 2)
    assert meter.raw(proj) == fixed  # raw: never scaled
    assert ContextMeter(2.0).ratio == 2.0 and not ContextMeter().calibrated


def test_the_meter_anchors_on_usage_and_scales_only_what_came_after() -> None:
    proj = Projection()
    proj._messages.extend([_user("a" * 30), _answer("b" * 30)])
    proj.last_usage = (2, 100)
    meter = ContextMeter(2.0)
    assert meter.used(proj) == 100
    proj._messages.append(_user("abc"))
    assert meter.used(proj) == 100 + 12  # (4 + 2) * 2
    proj.last_usage = (4, 100)  # an anchor past the end is not used
    assert meter.used(proj) == meter.scale(meter.raw(proj))
    proj.last_usage = (3, 50)  # at the end exactly: nothing after it
    assert meter.used(proj) == 50


@pytest.mark.parametrize(("reported", "estimated", "ratio"), [
    (500, 1000, 0.5), (1, 1000, 0.25), (1000, 1, 4.0), (300, 0, 4.0), (250, 1000, 0.25),
    (4000, 1000, 4.0), (1300, 1000, 1.3)])
def test_ratio_of_is_clamped(reported: int, estimated: int, ratio: float) -> None:
    assert estimate.ratio_of(reported, estimated) == pytest.approx(ratio)


def test_calibrate_records_only_a_real_change_and_a_new_meter_reads_it_back() -> None:
    ledger = Ledger("s1")
    meter = compaction.meter_of(ledger)
    assert compaction.meter_of(ledger) is meter
    assert not compaction.calibrate(ledger, 0, 100)
    assert not compaction.calibrate(ledger, 100, 0)
    assert compaction.calibrate(ledger, 100, 100)  # first: recorded even at 1.0
    assert meter.calibrated and meter.ratio == 1.0
    assert not compaction.calibrate(ledger, 104, 100)  # within 5%
    assert compaction.calibrate(ledger, 106, 100)
    assert meter.ratio == pytest.approx(1.06)
    assert not compaction.calibrate(ledger, 109, 103)  # 1.058: within 5% of 1.06
    assert compaction.calibrate(ledger, 50, 100)
    from dsh.ledger import plugin_events

    events = plugin_events.read(ledger, "dsh.compaction", "calibration")
    assert [dict(e.data) for e in events] == [
        {"reported": 100, "estimated": 100}, {"reported": 106, "estimated": 100},
        {"reported": 50, "estimated": 100}]
    del ledger._context_meter  # type: ignore[attr-defined]
    fresh = compaction.meter_of(ledger)
    assert fresh is not meter and fresh.calibrated and fresh.ratio == 0.5
    assert not compaction.meter_of(Ledger("s2")).calibrated


def test_agent_window_is_memoised_and_a_learnt_one_wins(make_app: Any) -> None:
    app = make_app(model="echo", context_window=300)
    agent = app.agent()
    assert compaction.agent_window(agent) == 300
    agent._window = 77
    assert compaction.agent_window(agent) == 77
    compaction.learn_window(agent, ProviderError("maximum context length is 64 tokens"))
    assert compaction.agent_window(agent) == 64
    compaction.learn_window(agent, ProviderError("too long, no number"))  # echo cannot probe
    assert compaction.agent_window(agent) == 64


def test_context_status(make_app: Any) -> None:
    app = make_app(model="echo", context_window=300)
    with app.session() as s:
        s.send("abc")
        status = compaction.context_status(app.agent(), s.ledger)
    assert status["window"] == 300 and status["compactions"] == 0
    assert status["used"] == compaction.meter_of(s.ledger).used(s.ledger.projection) > 0


# -- strategies ------------------------------------------------------------------------------


def test_apply_replaces_the_range() -> None:
    a, b, c = _user("a"), _answer("b"), _user("c")
    assert compaction.apply([a, b, c], Compaction(start=1, end=2, replacement=(c,),
                                                  strategy="x")) == [a, c, c]
    assert compaction.apply([a, b, c], Compaction(start=0, end=3, replacement=(),
                                                  strategy="x")) == []


def test_mask_stops_as_soon_as_enough_is_saved_and_keeps_the_latest() -> None:
    msgs = [_user("go"), *_call("1", 300), *_call("2", 300), *_call("3", 300),
            *_call("4", 300)]
    r = _request(msgs, target=0)
    r.used = r.estimate(msgs)
    c = compaction.mask_observations(r)  # keep=2: the first two results only
    assert c is not None and (c.start, c.end) == (2, 5) and c.strategy == "mask"
    masked = [m for m in c.replacement if m.role == "tool"]
    assert [m.content for m in masked] == [
        compaction.MASK.format(name="t", chars=300)] * 2
    assert c.replacement[1] == msgs[3]  # the call between stays
    r.target = r.used - 1  # one token to save: the first result is enough
    c = compaction.mask_observations(r)
    assert c is not None and (c.start, c.end) == (2, 3)
    assert compaction.mask_observations(r, keep=4) is None
    c = compaction.mask_observations(r, keep=0)
    assert c is not None and c.start == 2
    # Already masked results are not candidates.
    done = compaction.apply(msgs, compaction.mask_observations(_request(msgs, target=0),
                                                               keep=0) or Compaction(
        start=0, end=0, replacement=(), strategy="x"))
    assert compaction.mask_observations(_request(done, target=0), keep=0) is None
    assert strategies._is_masked(done[2]) and not strategies._is_masked(msgs[2])
    nameless = Message(role="tool", content="x" * 30, tool_call_id="9")
    c = compaction.mask_observations(_request([_user("a"), nameless, nameless], target=0),
                                     keep=1)
    assert c is not None and c.replacement[0].content == compaction.MASK.format(
        name="tool", chars=30)


def test_split_point_boundaries() -> None:
    assert compaction.split_point(_request([_user("a")])) == 0
    msgs = [_user("a" * 90), _answer("b" * 90), _user("c" * 90), _answer("d" * 90),
            _user("e")]
    # A tiny target keeps only the latest step.
    assert compaction.split_point(_request(msgs, target=0)) == 4
    # A target whose half holds the last three messages exactly.
    tail = _request(msgs).estimate(msgs[2:]) - _request(msgs).estimate([])
    assert compaction.split_point(_request(msgs, target=2 * tail)) == 2
    assert compaction.split_point(_request(msgs, target=2 * tail - 2)) == 3
    assert compaction.split_point(_request(msgs, target=10 ** 6)) == 1
    # A tool result is never the start; an assistant right after an assistant neither.
    loop = [_user("go"), *_call("1"), *_call("2"), _answer("x"), _answer("y")]
    assert compaction.split_point(_request(loop, target=0)) == 5


def test_the_chooser(monkeypatch: pytest.MonkeyPatch) -> None:
    big = [_user("go"), *_call("1", 600), *_call("2", 600), *_call("3", 600), _user("x")]
    r = _request(big, target=10 ** 6, strategy="mask")
    assert compaction.compact_context(r).strategy == "mask"  # type: ignore[union-attr]
    r.strategy = "truncate"
    r.target = 0
    assert compaction.compact_context(r).strategy == "truncate"  # type: ignore[union-attr]
    r.strategy = "off"
    assert compaction.compact_context(r) is None
    r.strategy = "a-plugin's"
    assert compaction.compact_context(r) is None
    called: list[str] = []

    def fake_summary(request: Any) -> Any:
        called.append(request.strategy)
        return None

    monkeypatch.setattr(summary, "summarize", fake_summary)
    r.strategy = "summarize"
    assert compaction.compact_context(r) is None and called == ["summarize"]
    # auto: masking that reaches the target is enough, no summary asked.
    r.strategy, r.target = "auto", 10 ** 6
    assert compaction.compact_context(r).strategy == "mask"  # type: ignore[union-attr]
    assert called == ["summarize"]
    # auto: not enough -> summary; none -> mask everything.
    r.target = 0
    c = compaction.compact_context(r)
    assert called == ["summarize", "auto"]
    assert c is not None and c.strategy == "mask" and c.end == 7  # keep=0: all three
    proposal = Compaction(start=0, end=1, replacement=(), strategy="summarize")
    monkeypatch.setattr(summary, "summarize", lambda request: proposal)
    assert compaction.compact_context(r) is proposal
    nothing = _request([_user("a")], target=0, strategy="auto")
    monkeypatch.setattr(summary, "summarize", lambda request: None)
    assert compaction.compact_context(nothing) is None


def test_truncate_drops_the_oldest_units_and_says_how_many() -> None:
    msgs = [_user("a" * 90), _answer("b" * 90), *_call("1", 90), _user("c" * 90),
            *_call("2", 90)]
    r = _request(msgs, target=0)
    c = compaction.truncate(r)
    assert c is not None and (c.start, c.end) == (0, 4)  # the newest user message and
    assert c.replacement == (_user(compaction.TRUNCATED.format(n=4)),)  # the last call stay
    # A kept unit inside the range stays in the replacement, after the note.
    mid = [_user("a" * 90), _user("now"), _answer("b" * 90), *_call("1", 90)]
    c = compaction.truncate(_request(mid, target=0))
    assert c is not None and (c.start, c.end) == (0, 3)
    assert c.replacement == (_user(compaction.TRUNCATED.format(n=2)), mid[1])
    r.target = r.estimate(msgs) - 1  # dropping the first unit is enough
    c = compaction.truncate(r)
    assert c is not None and (c.start, c.end) == (0, 1)
    assert c.replacement == (_user(compaction.TRUNCATED.format(n=1)),)
    assert compaction.truncate(_request([_user("a")], target=0)) is None
    assert compaction.truncate(_request([_user("a"), _answer("b")], target=0)) is None
    assert compaction.truncate(_request([], target=0)) is None


def test_truncate_leaves_the_note_out_when_it_outweighs_what_it_drops() -> None:
    note = _user(compaction.TRUNCATED.format(n=3))
    msgs = [note, _user("now"), *_call("1")]
    c = compaction.truncate(_request(msgs, target=0))
    assert c is not None and (c.start, c.end, c.replacement) == (0, 1, ())
    # Not when the history would then start with the assistant.
    msgs = [note, _answer("x"), _user("now"), *_call("1")]
    c = compaction.truncate(_request(msgs, target=0))
    assert c is not None and c.end == 2 and c.replacement[0].content.startswith("[2 earlier")


def test_the_request_helpers(make_app: Any) -> None:
    r = _request([_user("abc")])
    assert r.ratio == 1.0 and r.scale(7) == 7
    r.meter = ContextMeter(0.5)
    assert r.ratio == 0.5 and r.scale(7) == 4
    assert r.estimate([_user("abc")]) == 4  # ("[]" 1 + 6) / 2, rounded up
    r.agent = make_app(model="echo").agent()
    assert r.handle is r.agent.info


# -- summary sizing --------------------------------------------------------------------------


def test_summary_limit() -> None:
    r = _request([], window=None)
    assert summary.summary_limit(r, "x" * 30) == summary.MIN_SUMMARY_TOKENS
    assert summary.summary_limit(r, "x" * 3000) == 500
    r.window = 1000
    assert summary.summary_limit(r, "x" * 3000) == 250
    r.window = 4000
    assert summary.summary_limit(r, "x" * 3000) == 500
    r.meter = ContextMeter(0.5)
    assert summary.summary_limit(r, "x" * 3000) == 250


def test_room() -> None:
    r = _request([], window=None)
    assert summary.room(r, 50, "") > 10 ** 12
    r.window = 600
    fixed = compaction.estimate_tokens(
        summary.SUMMARY_SYSTEM + summary.PROMPT + summary.PREVIOUS) + summary.REQUEST_OVERHEAD
    assert summary.room(r, 50, "") == 600 - 50 - fixed
    assert summary.room(r, 50, "s" * 30) == 600 - 50 - (fixed + 10)
    r.meter = ContextMeter(0.5)
    assert summary.room(r, 50, "") == int((600 - 50 - -(-fixed // 2)) / 0.5)
    r.window = 100
    assert summary.room(r, 50, "") == 0


def test_cut() -> None:
    assert summary.cut("a" * 100, 10) == 22  # 30 is 11 tokens; 3/4 of it is 8
    assert summary.cut("a" * 20, 10) == 20  # all of it
    assert summary.cut("line\n" * 20, 10) == 20  # at the line end before 22
    assert summary.cut("a" * 100, 0) == 0
    assert summary.cut("é" * 100, 10) < 10 and compaction.estimate_tokens(
        "é" * summary.cut("é" * 100, 10)) <= 10
    assert summary.cut("\n" + "a" * 100, 10) == 22  # a newline in the first half: not used
    assert summary.cut("a" * 12 + "\n" + "a" * 100, 10) == 13


def _summarising_app(make_app: Any, script: Any, *answers: str, window: int) -> Any:
    model = script(*[{"text": a} for a in answers])
    return make_app(model="echo", summary_model=model, context_window=window)


def test_write_summary_in_pieces_each_with_the_summary_so_far(
        make_app: Any, script: Any, tmp_path: Path) -> None:
    app = _summarising_app(make_app, script, "S1", "S2", "S3", "S4", "S5", "S6", "S7",
                           window=400)
    agent = app.agent()
    older = [_user("word " * 120), _answer("reply " * 120)]
    r = CompactionRequest(agent=agent, messages=older, window=400, used=0, target=0,
                          reason="manual", strategy="summarize", projection=Projection())
    text, sid = summary.write_summary(r, older)
    assert text == "S1" and sid  # (each sub-run replays the script from its start)
    lines = [json.loads(x) for x in app.store.path(sid).read_text().splitlines()]
    prompt = next(d["text"] for d in lines if d["type"] == "user/message")
    assert "The summary so far (fold it in):\nS1\n" in prompt and "at most" in prompt
    start = next(d for d in lines if d["type"] == "turn/start")
    from dsh.ledger.history import render_history

    assert start["options"]["max_tokens"] == summary.summary_limit(r, render_history(older))
    assert start["options"]["max_tokens"] == 100  # a quarter of the window


def test_write_summary_discards_a_piece_summary_longer_than_its_input(
        make_app: Any, script: Any) -> None:
    app = _summarising_app(make_app, script, "L" * 3000, window=2000)
    agent = app.agent()
    older = [_user("short"), _answer("reply")]
    r = CompactionRequest(agent=agent, messages=older, window=2000, used=0, target=0,
                          reason="manual", strategy="summarize", projection=Projection())
    text, sid = summary.write_summary(r, older)
    assert text == "" and sid


def test_write_summary_without_room_asks_nothing(make_app: Any, script: Any) -> None:
    app = _summarising_app(make_app, script, window=100)
    r = CompactionRequest(agent=app.agent(), messages=[_user("a")], window=100, used=0,
                          target=0, reason="manual", strategy="summarize",
                          projection=Projection())
    assert summary.write_summary(r, [_user("a")]) == ("", "")


def test_a_failed_summary_run_is_an_error_unless_it_did_not_fit(
        make_app: Any, script: Any) -> None:
    msgs = [_user("a" * 300), _answer("b" * 300), _user("c")]
    for error, expected in (("context too long: no", None), ("boom", ProviderError)):
        model = script({"error": error, "status": 400})
        app = make_app(model="echo", summary_model=model, context_window=2000)
        r = CompactionRequest(agent=app.agent(), messages=msgs, window=2000, used=0,
                              target=0, reason="manual", strategy="summarize",
                              projection=Projection())
        if expected is None:
            assert summary.summarize(r) is None
        else:
            with pytest.raises(ProviderError, match="the summary run .* ended with error"):
                summary.summarize(r)


# -- trigger ---------------------------------------------------------------------------------


def test_is_context_error() -> None:
    assert not trigger.is_context_error(ValueError("context too long"))
    assert trigger.is_context_error(ProviderError("Context too long for model"))
    assert trigger.is_context_error(ProviderError("would EXCEED CONTEXT WINDOW"))
    assert not trigger.is_context_error(ProviderError("rate limited"))
    e = ProviderError("x")
    e.context_overflow = True  # type: ignore[attr-defined]
    assert trigger.is_context_error(e)


@pytest.mark.parametrize(("options", "reserve"), [
    ({}, 0), ({"max_tokens": 96}, 96), ({"max_completion_tokens": 50}, 50),
    ({"max_output_tokens": 40}, 40), ({"num_predict": 30}, 30), ({"max_tokens": 900}, 256),
    ({"max_tokens": 0}, 0), ({"max_tokens": -5}, 0), ({"max_tokens": True}, 0),
    ({"max_tokens": "96"}, 0), ({"max_tokens": 0, "num_predict": 20}, 20)])
def test_output_reserve(options: dict[str, Any], reserve: int) -> None:
    proj = Projection()
    proj.options = options
    assert trigger.output_reserve(proj, 512) == reserve


def test_limit_of() -> None:
    assert trigger.limit_of(512, 96) == 416
    assert trigger.limit_of(512, 96, 1) == int(416 * 0.7)
    assert trigger.limit_of(512, 0, 2) == int(512 * 0.49)


def _scripted_session(make_app: Any, script: Any, *, window: int, n: int = 4,
                      **kw: Any) -> tuple[Any, Any]:
    app = make_app(context_window=window, model=script(*[{"text": "a" * 90}] * (n + 4)), **kw)
    s = app.session()
    for i in range(n):
        s.send(f"{i} " + "q" * 90)
    return app, s


def test_maybe_compact_fires_only_past_the_threshold(make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, compaction="truncate")
    with s:
        agent, ledger = app.agent(), s.ledger
        used = compaction.meter_of(ledger).used(ledger.projection)
        agent._window = int(used / agent.compact_at) + 1
        compaction.maybe_compact(agent, ledger, None)
        assert ledger.projection.compactions == 0
        agent._window = int(used / agent.compact_at)
        compaction.maybe_compact(agent, ledger, None)
        assert ledger.projection.compactions == 1
        agent._window = None
        compaction.maybe_compact(agent, ledger, None)
        assert ledger.projection.compactions == 1


def test_maybe_compact_keeps_room_for_the_answer(make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, compaction="truncate",
                               compact_at=1.0)
    with s:
        agent, ledger = app.agent(), s.ledger
        used = compaction.meter_of(ledger).used(ledger.projection)
        agent._window = used + 10
        compaction.maybe_compact(agent, ledger, None)
        assert ledger.projection.compactions == 0
        ledger.projection.options = {"max_tokens": 11}
        compaction.maybe_compact(agent, ledger, None)
        assert ledger.projection.compactions == 1


def test_maybe_compact_does_nothing_when_off(make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=100, compaction="off")
    with s:
        compaction.maybe_compact(app.agent(), s.ledger, None)
        assert s.ledger.projection.compactions == 0


@pytest.mark.parametrize("bad", [
    "not a compaction",
    Compaction(start=-1, end=0, replacement=(), strategy="x"),
    Compaction(start=2, end=1, replacement=(), strategy="x"),
    Compaction(start=0, end=99, replacement=(), strategy="x"),
    Compaction(start=0, end=1, replacement=("text",), strategy="x")])
def test_an_invalid_compaction_names_the_plugin(make_app: Any, script: Any,
                                                plugin_module: Any, bad: Any) -> None:
    @hookimpl
    def compact_context(request: Any) -> Any:
        return bad

    name = plugin_module(compact_context=compact_context)
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[name])
    with s, pytest.raises(PluginError, match=f"plugin {name} returned an invalid compaction"):
        compaction.compact_now(app.agent(), s.ledger, None, reason="manual")


def test_a_valid_compaction_at_the_edges_is_recorded(make_app: Any, script: Any,
                                                     plugin_module: Any) -> None:
    @hookimpl
    def compact_context(request: Any) -> Any:
        n = len(request.messages)
        return Compaction(start=0, end=n, replacement=(Message(role="user", content="s"),),
                          strategy="all")

    name = plugin_module(compact_context=compact_context)
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[name])
    with s:
        event = compaction.compact_now(app.agent(), s.ledger, None, reason="manual")
        assert event.strategy == "all" and event.plugin == name and event.reason == "manual"
        assert event.end == 8 and len(s.ledger.projection) == 1


def _wrapper_plugins(plugin_module: Any, kind: str) -> str:
    if kind == "old":
        @hookimpl(hookwrapper=True)
        def compact_context(request: Any) -> Any:
            yield

    elif kind == "no-yield":
        @hookimpl(wrapper=True)
        def compact_context(request: Any) -> Any:
            if False:
                yield
            return None

    elif kind == "twice":
        @hookimpl(wrapper=True)
        def compact_context(request: Any) -> Any:
            yield
            yield

    else:  # raise: a wrapper sees the inner failure and may swallow it
        @hookimpl(wrapper=True)
        def compact_context(request: Any) -> Any:
            try:
                return (yield)
            except PluginError:
                return Compaction(start=0, end=1, replacement=(), strategy="rescued")

    return str(plugin_module(compact_context=compact_context))


@pytest.mark.parametrize(("kind", "match"), [
    ("old", "old-style hookwrapper on compact_context"),
    ("no-yield", "its compact_context wrapper did not yield"),
    ("twice", "its compact_context wrapper yielded twice")])
def test_wrapper_errors_name_the_plugin(make_app: Any, script: Any, plugin_module: Any,
                                        kind: str, match: str) -> None:
    name = _wrapper_plugins(plugin_module, kind)
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[name], n=1)
    with s, pytest.raises(PluginError, match=f"plugin {name}: {match}") as info:
        compaction.compact_now(app.agent(), s.ledger, None, reason="manual")
    assert info.value.plugin == name


def test_a_wrapper_sees_an_inner_failure_and_can_answer_instead(
        make_app: Any, script: Any, plugin_module: Any) -> None:
    @hookimpl
    def compact_context(request: Any) -> Any:
        raise RuntimeError("inner")

    inner = plugin_module(compact_context=compact_context)
    outer = _wrapper_plugins(plugin_module, "raise")
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[inner, outer], n=1)
    with s:
        event = compaction.compact_now(app.agent(), s.ledger, None, reason="manual")
        assert event.strategy == "rescued" and event.plugin == outer
    app2, s2 = _scripted_session(make_app, script, window=10 ** 6, load=[inner], n=1)
    with s2, pytest.raises(PluginError, match="RuntimeError: inner"):
        compaction.compact_now(app2.agent(), s2.ledger, None, reason="manual")


def test_record_refuses_what_does_not_shrink_and_records_the_measure(
        make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=2)
    with s:
        ledger = s.ledger
        proj = ledger.projection
        same = Compaction(start=0, end=1, replacement=(proj.view()[0],), strategy="x")
        assert compaction.record(ledger, same, "p", "manual") is None
        meter = compaction.meter_of(ledger)
        meter.ratio = 2.0
        before = meter.estimate(proj)
        less = Compaction(start=0, end=2, replacement=(), strategy="x")
        event = compaction.record(ledger, less, "p", "manual")
        assert (event.tokens_before, event.tokens_after) == (before, meter.estimate(proj))
        assert event.tokens_after < before and event.plugin == "p"


def test_too_large_blames_the_system_prompt_only_on_the_providers_count(
        make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=1)
    with s:
        ledger, agent = s.ledger, app.agent()
        meter = compaction.meter_of(ledger)
        ledger.projection.system = "s" * 3000  # 1001 tokens
        with pytest.raises(ProviderError, match="newest user message"):
            compaction.too_large(agent, ledger, 1000, 1000, 5000)
        meter.calibrated = True
        with pytest.raises(ProviderError, match=r"system prompt and the 0 tool schemas alone "
                                                r"are about 1002 tokens.*\(1000 tokens\)"):
            compaction.too_large(agent, ledger, 1000, 1000, 5000)
        with pytest.raises(ProviderError, match=r"\(2000 tokens, 1000 of them for the prompt"):
            compaction.too_large(agent, ledger, 2000, 1000, 5000)


def test_too_large_leaves_out_a_big_tool_result_and_lets_the_turn_go_on(
        make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=1)
    with s:
        ledger, agent = s.ledger, app.agent()
        proj = ledger.projection
        proj._messages = [_user("hi"), *_call("1", 3000)]
        event = compaction.too_large(agent, ledger, 400, 400, 1100)
        assert event.strategy == "drop-oversized" and event.reason == "oversized"
        assert (event.start, event.end) == (2, 3)
        assert "[message left out: about 1005 tokens" in proj.view()[2].content
        proj._messages = [_user("x" * 3000), _answer("b" * 600)]
        with pytest.raises(ProviderError, match="the newest user message is about 1005 tokens"):
            compaction.too_large(agent, ledger, 400, 400, 1300)


def test_compact_now_runs_the_last_resort_and_then_fails_clearly(
        make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=4, compaction="mask")
    with s:
        ledger, agent = s.ledger, app.agent()
        agent._window = 120
        event = compaction.compact_now(agent, ledger, None, reason="threshold")
        assert event.strategy == "truncate" and event.plugin == "dsh.compaction"
        assert event.reason == "threshold"
        # By hand with nothing left to drop and still too large: the error names the part.
        agent._window = 20
        with pytest.raises(ProviderError, match="context too long"):
            compaction.compact_now(agent, ledger, None, reason="manual")


def test_compact_now_on_a_refusal_tightens(make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=6, compaction="truncate")
    with s:
        ledger, agent = s.ledger, app.agent()
        used = compaction.meter_of(ledger).used(ledger.projection)
        agent._window = used + 1
        assert compaction.compact_now(agent, ledger, None, reason="provider",
                                      tighten=0) is not None  # the hook's own truncation
        after0 = compaction.meter_of(ledger).used(ledger.projection)
        assert after0 <= (used + 1) // 2
        compaction.compact_now(agent, ledger, None, reason="provider", tighten=3)
        assert compaction.meter_of(ledger).used(ledger.projection) < after0


# -- estimate: the edges mutation testing found --------------------------------------------


def test_calibrate_edges() -> None:
    ledger = Ledger("s3")
    assert compaction.calibrate(ledger, 1, 100)  # the smallest counts still calibrate
    assert compaction.meter_of(ledger).ratio == estimate.MIN_RATIO
    other = Ledger("s4")
    assert compaction.calibrate(other, 100, 1)
    assert compaction.meter_of(other).ratio == estimate.MAX_RATIO
    exact = Ledger("s5")
    assert compaction.calibrate(exact, 4, 13)
    assert not compaction.calibrate(exact, 84, 260)  # moved by exactly 5%: not recorded
    assert estimate.ratio_of(1, 1) == 1.0 and estimate.ratio_of(3, 2) == 1.5


def test_meter_of_reads_the_calibration_not_another_event_of_the_plugin() -> None:
    from dsh.ledger import plugin_events

    ledger = Ledger("s6")
    compaction.calibrate(ledger, 50, 100)
    plugin_events.record(ledger, "dsh.compaction", "other", {"x": 1})
    del ledger._context_meter  # type: ignore[attr-defined]
    assert compaction.meter_of(ledger).ratio == 0.5
    assert ContextMeter().calibrated is False


def test_context_status_when_the_window_cannot_be_known(
        make_app: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app(model="echo")
    with app.session() as s:
        s.send("abc")

        def broken(agent: Any) -> int:
            raise RuntimeError("adapter")

        monkeypatch.setattr(estimate, "agent_window", broken)
        assert compaction.context_status(app.agent(), s.ledger)["window"] is None


def test_window_for_asks_in_order() -> None:
    """The order of window_for, on stand-ins holding only what it reads."""
    from types import SimpleNamespace

    class Model:
        def __init__(self, size: Any) -> None:
            self.context_window = size

    def agent(models: dict[str, Any], model_id: str, model: Any, **kw: Any) -> Any:
        app = SimpleNamespace(config=SimpleNamespace(models=models))
        return SimpleNamespace(app=app, model_id=model_id, model=model, **kw)

    assert compaction.window_for(agent({}, "x", Model(None))) is None
    assert compaction.window_for(agent({}, "x", Model(900))) == 900
    assert compaction.window_for(agent({}, "x", Model(lambda: 700))) == 700
    assert compaction.window_for(agent({}, "x", object())) is None
    assert compaction.window_for(agent({"x": {"model": "gpt-4o-mini"}}, "x",
                                       Model(None))) == 128_000
    assert compaction.window_for(agent({"x": {"context_window": 300}}, "x", Model(900))) == 300
    assert compaction.window_for(agent({}, "x", Model(900), context_window=50)) == 50
    assert compaction.window_for(agent({}, "gpt-4o-mini", Model(None))) == 128_000


def test_fixed_follows_the_tools_and_counts_their_text_unescaped() -> None:
    proj = Projection()
    meter = ContextMeter()
    empty = meter.fixed(proj)
    proj.tools = (ToolSpec(name="t", description="é" * 30),)
    wide = meter.fixed(proj)
    assert wide > empty
    text = json.dumps([["t", "é" * 30, {}]], ensure_ascii=False)
    assert wide == compaction.estimate_tokens(text)


# -- strategies: the edges mutation testing found ------------------------------------------


def test_a_tool_result_that_mentions_omitted_is_still_maskable() -> None:
    msgs = [_user("go"), *_call("1"), *_call("2"), *_call("3")]
    msgs[2] = Message(role="tool", content="nothing omitted here", tool_call_id="1", name="t")
    c = compaction.mask_observations(_request(msgs, target=0))
    assert c is not None and c.start == 2


def test_mask_stops_when_the_excess_is_exactly_zero() -> None:
    msgs = [_user("go"), *_call("1", 300), *_call("2", 300), *_call("3", 300),
            *_call("4", 300)]
    r = _request(msgs, target=0)
    saved = compaction.message_tokens(msgs[2]) - compaction.message_tokens(
        Message(role="tool", content=compaction.MASK.format(name="t", chars=300)))
    r.target = r.used - saved
    c = compaction.mask_observations(r)
    assert c is not None and (c.start, c.end) == (2, 3)
    r.target = r.used - saved - 1
    c = compaction.mask_observations(r)
    assert c is not None and (c.start, c.end) == (2, 5)


def test_auto_takes_the_mask_that_reaches_the_target_exactly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sentinel = Compaction(start=0, end=1, replacement=(), strategy="summarize")
    monkeypatch.setattr(summary, "summarize", lambda request: sentinel)
    msgs = [_user("go"), *_call("1", 600), *_call("2", 600), *_call("3", 600), _user("x")]
    r = _request(msgs, target=0, strategy="mask")
    masked = compaction.mask_observations(r)
    assert masked is not None
    r.target = r.estimate(compaction.apply(msgs, masked))
    r.strategy = "auto"
    assert compaction.compact_context(r) == compaction.mask_observations(r)
    assert compaction.compact_context(r).end == 3  # type: ignore[union-attr]
    r.target -= 1  # one short: the summary is asked for
    assert compaction.compact_context(r) is sentinel


def test_truncate_edges() -> None:
    # Two units are enough to drop one.
    two = [_answer("a" * 300), *_call("1")]
    c = compaction.truncate(_request(two, target=0))
    assert c is not None and (c.start, c.end) == (0, 1)
    # No user message at all: every unit but the latest may go.
    none = [_answer("a" * 300), _answer("b" * 300), *_call("1")]
    c = compaction.truncate(_request(none, target=0))
    assert c is not None and c.end == 2
    assert c.replacement == (_user(compaction.TRUNCATED.format(n=2)),)
    # An orphan tool result first is a unit of its own.
    orphan = [Message(role="tool", content="r" * 300, tool_call_id="0", name="t"),
              _answer("x" * 300), *_call("1")]
    c = compaction.truncate(_request(orphan, target=0))
    assert c is not None and c.replacement[0].content.startswith("[2 earlier")
    # The target is what the whole next request comes to, not the projection's.
    msgs = [_user("a" * 90), _answer("b" * 90), *_call("1", 90), _user("c" * 90),
            *_call("2", 90)]
    c = compaction.truncate(_request(msgs, target=1))
    assert c is not None and c.end == 4
    # A target reached exactly stops there.
    r = _request(msgs, target=0)
    first = Compaction(start=0, end=1, replacement=(
        _user(compaction.TRUNCATED.format(n=1)),), strategy="truncate")
    r.target = r.estimate(compaction.apply(msgs, first))
    assert compaction.truncate(r) == first


def test_truncate_without_the_note_keeps_the_newest_user_message() -> None:
    msgs = [_answer(""), _user("now"), _answer(""), *_call("1")]
    c = compaction.truncate(_request(msgs, target=0))
    assert c is not None and (c.start, c.end) == (0, 3) and c.replacement == (msgs[1],)


def test_truncate_proposes_nothing_that_does_not_shrink() -> None:
    note = compaction.TRUNCATED.format(n=1)
    msgs = [_answer("f" * len(note)), _answer("q"), *_call("1")]
    r = _request(msgs, target=0)
    r.target = r.estimate(msgs)  # one unit out would reach it, but only by a note as big
    assert compaction.truncate(r) is None
    grows = [_answer(""), _answer(""), *_call("1")]
    assert compaction.truncate(_request(grows, target=0)) is None


# -- trigger: the exact boundaries ----------------------------------------------------------


def test_the_threshold_and_the_answers_room_are_inclusive(make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, compaction="truncate",
                               compact_at=0.5)
    with s:
        agent, ledger = app.agent(), s.ledger
        used = compaction.meter_of(ledger).used(ledger.projection)
        agent._window = 2 * used  # used is exactly compact_at of the window
        compaction.maybe_compact(agent, ledger, None)
        assert ledger.projection.compactions == 0
        agent._window = 2 * used - 1
        compaction.maybe_compact(agent, ledger, None)
        assert ledger.projection.compactions == 1
    app, s = _scripted_session(make_app, script, window=10 ** 6, compaction="truncate",
                               compact_at=1.0)
    with s:
        agent, ledger = app.agent(), s.ledger
        used = compaction.meter_of(ledger).used(ledger.projection)
        agent._window = used + 10
        ledger.projection.options = {"max_tokens": 10}  # leaves exactly the prompt's room
        compaction.maybe_compact(agent, ledger, None)
        assert ledger.projection.compactions == 0


def test_the_hook_is_asked_with_the_limit_the_reserve_and_the_reason(
        make_app: Any, script: Any, plugin_module: Any) -> None:
    seen: list[CompactionRequest] = []

    @hookimpl(tryfirst=True)
    def compact_context(request: CompactionRequest) -> Any:
        seen.append(request)
        return None

    name = plugin_module(compact_context=compact_context)
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[name], n=2,
                               compaction="mask")
    with s:
        agent, ledger = app.agent(), s.ledger
        used = compaction.meter_of(ledger).used(ledger.projection)
        agent._window = None
        assert compaction.compact_now(agent, ledger, None, reason="manual") is None
        r = seen[-1]
        assert (r.window, r.target, r.reserve, r.used) == (None, used // 2, 0, used)
        assert (r.reason, r.strategy, r.ledger, r.ctx) == ("manual", "mask", ledger, None)
        assert r.meter is compaction.meter_of(ledger) and r.projection is ledger.projection
        agent._window = 10 ** 5
        ledger.projection.options = {"max_tokens": 1000}
        compaction.compact_now(agent, ledger, None, reason="provider", strategy="x",
                               tighten=1)
        r = seen[-1]
        assert (r.window, r.reserve, r.strategy) == (10 ** 5, 1000, "x")
        assert r.target == int(int((10 ** 5 - 1000) * 0.7) * compaction.TARGET_FRACTION)


def test_at_the_limit_exactly_nothing_is_truncated(make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, compaction="off", n=3)
    with s:
        agent, ledger = app.agent(), s.ledger
        agent._window = compaction.meter_of(ledger).used(ledger.projection)
        assert compaction.compact_now(agent, ledger, None, reason="manual") is None
        agent._window -= 1
        event = compaction.compact_now(agent, ledger, None, reason="manual")
        assert event is not None and event.strategy == "truncate"


def test_hopeless_is_a_message_over_the_limit_at_four_characters_a_token() -> None:
    proj = Projection()
    proj._messages.append(_user("a" * 297))  # 4 + 100 tokens: 78 at the optimistic rate
    assert trigger._hopeless(proj, 77) and not trigger._hopeless(proj, 78)


def test_too_large_leaves_out_only_what_is_over_half_the_limit(
        make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=1)
    with s:
        ledger, agent = s.ledger, app.agent()
        proj = ledger.projection
        # 205 and 105 tokens; half the limit of 210 is 105: only the first goes.
        proj._messages = [_user("a" * 600), _answer("b" * 300), _user("now")]
        event = compaction.too_large(agent, ledger, 210, 210, 600)
        assert (event.start, event.end) == (0, 1)
        assert proj.view()[1].content == "b" * 300
        # Enough left out once the excess is gone: 305 - 100 = 205, the first message.
        proj._messages = [_user("a" * 600), _answer("b" * 300), _user("now")]
        event = compaction.too_large(agent, ledger, 200, 200, 305)
        assert (event.start, event.end) == (0, 1)
        proj._messages = [_user("a" * 600), _answer("b" * 300), _user("now")]
        event = compaction.too_large(agent, ledger, 200, 200, 400)
        assert (event.start, event.end) == (0, 2)
        assert event.tokens_after < event.tokens_before
        assert event.messages[1].content == (
            "[message left out: about 105 tokens, larger than the model's context window "
            "of 200]")


def test_too_large_says_which_part_when_nothing_can_go(make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=1)
    with s:
        ledger, agent = s.ledger, app.agent()
        ledger.projection._messages = [_answer("b" * 6), _user("now"), _answer("")]
        with pytest.raises(ProviderError) as info:
            compaction.too_large(agent, ledger, 20, 20, 50)
        assert str(info.value) == (
            "context too long: the model's context window (20 tokens) cannot hold the system "
            "prompt and the 0 tool schemas (about 1 tokens) with the newest user message "
            "(about 6 tokens) and the 2 other messages left after compaction 'auto' (about 50 "
            "tokens in all, by dsh's estimate); shorten the message or the system prompt, or "
            "give the agent fewer tools (-T NAME, or [agents.NAME] tools = [...])")
        ledger.projection._messages = [_answer("b" * 3)]
        with pytest.raises(ProviderError, match=r"newest user message \(about 0 tokens\)"):
            compaction.too_large(agent, ledger, 20, 20, 50)


# -- summary: the prompt and the pieces -----------------------------------------------------


def test_a_long_text_loses_its_middle_and_each_piece_fits(make_app: Any, script: Any) -> None:
    app = _summarising_app(make_app, script, *["S"] * 20, window=600)
    agent = app.agent()
    older = [_user(f"HEAD {'w' * 3000}"), _answer(f"{'m' * 6000} TAIL")]
    r = CompactionRequest(agent=agent, messages=older, window=600, used=0, target=0,
                          reason="manual", strategy="summarize", projection=Projection())
    before = set(app.store.path("x").parent.glob("*.jsonl"))
    text, sid = summary.write_summary(r, older)
    assert text == "S"
    runs = sorted(set(app.store.path("x").parent.glob("*.jsonl")) - before)
    prompts = [next(json.loads(x)["text"] for x in p.read_text().splitlines()
                    if json.loads(x)["type"] == "user/message") for p in runs]
    assert 2 <= len(prompts) <= summary.MAX_CHUNKS
    joined = "".join(prompts)
    assert "HEAD" in joined and "TAIL" in joined and "[...]" in joined
    limit = 150  # a quarter of the window
    assert all(f"at most {limit * 3 // 5} words" in p for p in prompts)
    assert all(compaction.estimate_tokens(summary.SUMMARY_SYSTEM + p) + limit
               + summary.REQUEST_OVERHEAD <= 600 for p in prompts)


def test_summarize_proposes_nothing_for_an_empty_summary_or_no_older_part(
        make_app: Any, script: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    msgs = [_user("a" * 300), _answer("b" * 300), _user("c")]
    r = _request(msgs, target=0)
    assert summary.summarize(_request([_user("a")], target=0)) is None
    monkeypatch.setattr(summary, "write_summary", lambda request, older: ("  ", "sid"))
    assert summary.summarize(r) is None
    monkeypatch.setattr(summary, "write_summary", lambda request, older: (" S ", "sid"))
    c = summary.summarize(r)
    assert c is not None and (c.start, c.end, c.summary_session) == (0, 2, "sid")
    assert c.replacement == (_user(f"{compaction.SUMMARY_OPEN}\nS\n{compaction.SUMMARY_CLOSE}"),)
    same = "x" * 600
    monkeypatch.setattr(summary, "write_summary", lambda request, older: (same, "sid"))
    assert summary.summarize(r) is None


def test_too_large_replaces_only_the_messages_it_leaves_out(make_app: Any,
                                                             script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=1)
    with s:
        ledger, agent = s.ledger, app.agent()
        msgs = [_answer("a" * 600), _answer("s"), _answer("c" * 600), _user("now")]
        ledger.projection._messages = list(msgs)
        event = compaction.too_large(agent, ledger, 200, 200, 600)
        assert (event.start, event.end, event.plugin) == (0, 3, "dsh.compaction")
        assert event.messages[1] == msgs[1]
        assert event.messages[0].content.startswith("[message left out: about 205 tokens")


def test_the_system_prompt_is_blamed_from_the_window_exactly(make_app: Any,
                                                             script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=1)
    with s:
        ledger, agent = s.ledger, app.agent()
        compaction.meter_of(ledger).calibrated = True
        ledger.projection.system = "s" * 3000  # 1001, and 1 for no tools
        with pytest.raises(ProviderError, match="alone are about 1002 tokens"):
            compaction.too_large(agent, ledger, 1002, 1002, 5000)
        with pytest.raises(ProviderError, match="newest user message"):
            compaction.too_large(agent, ledger, 1003, 1003, 5000)


def test_hopeless_rounds_down() -> None:
    proj = Projection()
    proj._messages.append(_user("a" * 300))  # 105 tokens: 78.75, counted as 78
    assert not trigger._hopeless(proj, 78) and trigger._hopeless(proj, 77)


def test_sessions_compact_by_hand_uses_the_sessions_agent(make_app: Any, script: Any) -> None:
    app = make_app(agent="a", model="echo", agents={"a": {"compaction": "mask"},
                                                  "b": {"compaction": "truncate"}})
    with app.session("b") as s:
        for i in range(3):
            s.send(f"{i} " + "q" * 300)
        sid = s.ledger.session_id
    event = compaction.compact_session(app, sid)
    assert event is not None and event.strategy == "truncate"
    assert compaction.compact_session(app, sid, agent="a") is None


def test_hook_errors_carry_the_plugin_and_the_hook(make_app: Any, script: Any,
                                                   plugin_module: Any) -> None:
    @hookimpl
    def compact_context(request: Any) -> Any:
        return "not a compaction"

    name = plugin_module(compact_context=compact_context)
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[name], n=1)
    with s, pytest.raises(PluginError) as info:
        compaction.compact_now(app.agent(), s.ledger, None, reason="manual")
    assert (info.value.plugin, info.value.hook) == (name, "compact_context")
    for kind in ("old", "no-yield", "twice"):
        wname = _wrapper_plugins(plugin_module, kind)
        app, s = _scripted_session(make_app, script, window=10 ** 6, load=[wname], n=1)
        with s, pytest.raises(PluginError) as info:
            compaction.compact_now(app.agent(), s.ledger, None, reason="manual")
        assert (info.value.plugin, info.value.hook) == (wname, "compact_context")


def test_an_empty_range_is_a_valid_compaction(make_app: Any, script: Any,
                                              plugin_module: Any) -> None:
    @hookimpl
    def compact_context(request: Any) -> Any:
        return Compaction(start=1, end=1, replacement=(), strategy="nothing")

    name = plugin_module(compact_context=compact_context)
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[name], n=1)
    with s:  # valid, but it does not shrink anything: not recorded
        assert compaction.compact_now(app.agent(), s.ledger, None, reason="manual") is None


def test_inner_failures_name_the_hook_and_reach_every_wrapper(
        make_app: Any, script: Any, plugin_module: Any) -> None:
    @hookimpl
    def compact_context(request: Any) -> Any:
        raise RuntimeError("inner")

    inner = plugin_module(compact_context=compact_context)
    seen: list[str] = []

    @hookimpl(wrapper=True)
    def outer_wrapper(request: Any) -> Any:
        try:
            return (yield)
        except PluginError as exc:
            seen.append(str(exc))
            raise

    outer = plugin_module(compact_context=outer_wrapper)
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[inner, outer], n=1)
    with s, pytest.raises(PluginError, match="raised in hook compact_context"):
        compaction.compact_now(app.agent(), s.ledger, None, reason="manual")
    assert seen and "inner" in seen[0]


def test_every_wrapper_completes_and_the_outermost_replacement_wins(
        make_app: Any, script: Any, plugin_module: Any) -> None:
    def replacing(tag: str) -> Any:
        @hookimpl(wrapper=True)
        def compact_context(request: Any) -> Any:
            yield
            return Compaction(start=0, end=2, replacement=(), strategy=tag)

        return compact_context

    @hookimpl(wrapper=True)
    def failing(request: Any) -> Any:
        yield
        raise RuntimeError("after")

    first = plugin_module(compact_context=replacing("first"))
    second = plugin_module(compact_context=replacing("second"))
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[first, second], n=2)
    with s:
        event = compaction.compact_now(app.agent(), s.ledger, None, reason="manual")
        assert event is not None and event.plugin in (first, second)
        innermost = {first, second} - {event.plugin}
        assert innermost  # both ran; the one pluggy calls first wins
    bad = plugin_module(compact_context=failing)
    app, s = _scripted_session(make_app, script, window=10 ** 6, load=[first, bad], n=2)
    with s, pytest.raises(RuntimeError, match="after"):
        compaction.compact_now(app.agent(), s.ledger, None, reason="manual")


def test_when_too_large_runs_from_compact_now(make_app: Any, script: Any) -> None:
    app, s = _scripted_session(make_app, script, window=10 ** 6, n=1, compaction="off")
    with s:
        ledger, agent = s.ledger, app.agent()
        # A tool result too large by itself, by hand: left out, and the event returned.
        ledger.projection._messages = [_user("hi"), *_call("1", 3000)]
        agent._window = 600
        event = compaction.compact_now(agent, ledger, None, reason="manual")
        assert event is not None and event.strategy == "drop-oversized"
        # Before a request, over the limit but not hopeless: sent as it is.
        # (65 + 8 + 65 tokens and 1 of tools: over 130, each part at most half of it.)
        ledger.projection._messages = [_user("c" * 180), *_call("1", 180)]
        agent._window = 130
        assert compaction.compact_now(agent, ledger, None, reason="threshold") is None
        # By hand, the same: nothing could be compacted, so the error says why.
        with pytest.raises(ProviderError, match="compaction 'off'"):
            compaction.compact_now(agent, ledger, None, reason="manual")
