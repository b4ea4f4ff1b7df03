"""Tests of text tool-call rescue (dsh.llm.rescue, MISSION D5)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dsh.llm.rescue import SOURCES
from dsh.llm.rescue import Rescued
from dsh.llm.rescue import StreamGate
from dsh.llm.rescue import rescue_tool_calls

TOOLS = frozenset(
    {"get_weather", "get_time", "search", "read_file", "write_file", "run_shell", "calculator"}
)

W_PARIS = ("get_weather", {"city": "Paris"})
T_UTC = ("get_time", {"tz": "UTC"})

Case = tuple[str, str, list[tuple[str, dict[str, Any]]], str]

# (text, expected content, expected calls, source)
HERMES: list[Case] = [
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        [W_PARIS],
        "hermes",
    ),
    (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
        "",
        [W_PARIS, T_UTC],
        "hermes",
    ),
    (
        "I'll check the weather for you.\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "I'll check the weather for you.",
        [W_PARIS],
        "hermes",
    ),
    (
        '<tool_call>{"name": "search", "parameters": {"query": "attrs frozen"}}</tool_call>',
        "",
        [("search", {"query": "attrs frozen"})],
        "hermes",
    ),
    (  # "}" and "</tool_call>" inside a JSON string
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.txt", '
        '"content": "x }</tool_call> y"}}\n</tool_call>',
        "",
        [("write_file", {"path": "a.txt", "content": "x }</tool_call> y"})],
        "hermes",
    ),
    (  # OpenAI-style JSON-encoded arguments
        '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"hi\\"}"}</tool_call>',
        "",
        [("search", {"query": "hi"})],
        "hermes",
    ),
    ('<tool_call>{"name": "get_time"}</tool_call>', "", [("get_time", {})], "hermes"),
    (  # Hermes 2 Pro key order, trailing end-of-turn token dropped
        '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n'
        "</tool_call><|im_end|>",
        "",
        [W_PARIS],
        "hermes",
    ),
    (  # wrapped in a code fence: the dangling fence is not content
        'Calling:\n```\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n'
        "</tool_call>\n```",
        "Calling:",
        [T_UTC],
        "hermes",
    ),
    (  # a mention of the tag that is not followed by JSON is prose
        "<think>I should use <tool_call> with get_time.</think>\n<tool_call>\n"
        '{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
        "<think>I should use <tool_call> with get_time.</think>",
        [T_UTC],
        "hermes",
    ),
    (  # Qwen3: a think block before the call
        "<think>\nThe user wants the time.\n</think>\n\n<tool_call>\n"
        '{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
        "<think>\nThe user wants the time.\n</think>",
        [T_UTC],
        "hermes",
    ),
]

FENCED: list[Case] = [
    (
        'I will search.\n```json\n{"name": "search", "arguments": {"query": "python attrs"}}\n```',
        "I will search.",
        [("search", {"query": "python attrs"})],
        "fenced_json",
    ),
    ('```\n{"name": "get_time", "arguments": {}}\n```', "", [("get_time", {})], "fenced_json"),
    (
        '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "parameters": {"tz": "UTC"}}]\n```',
        "",
        [W_PARIS, T_UTC],
        "fenced_json",
    ),
    (
        'Here is code:\n```python\nprint("hi")\n```\nNow running it:\n```json\n'
        '{"name": "run_shell", "arguments": {"cmd": "python a.py"}}\n```\nDone.',
        'Here is code:\n```python\nprint("hi")\n```\nNow running it:',
        [("run_shell", {"cmd": "python a.py"})],
        "fenced_json",
    ),
    (  # a fence inside a JSON string does not close the block
        '```json\n{"name": "write_file", "arguments": {"path": "README.md", '
        '"content": "```sh\\nmake\\n```"}}\n```',
        "",
        [("write_file", {"path": "README.md", "content": "```sh\nmake\n```"})],
        "fenced_json",
    ),
    (
        '```JSON {"name": "calculator", "arguments": "{\\"expression\\": \\"2+2\\"}"} ```',
        "",
        [("calculator", {"expression": "2+2"})],
        "fenced_json",
    ),
    (
        'Step 1:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n'
        'Step 2:\n```json\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n```',
        "Step 1:",
        [W_PARIS, T_UTC],
        "fenced_json",
    ),
]

LLAMA: list[Case] = [
    (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        [W_PARIS],
        "llama_json",
    ),
    (
        '{"name": "get_weather", "parameters": {"city": "San Francisco", "unit": "celsius"}}',
        "",
        [("get_weather", {"city": "San Francisco", "unit": "celsius"})],
        "llama_json",
    ),
    (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {"tz": "UTC"}}',
        "",
        [W_PARIS, T_UTC],
        "llama_json",
    ),
    (
        '{"name": "search", "arguments": {"query": "a"}}; {"name": "get_time", "arguments": {}}',
        "",
        [("search", {"query": "a"}), ("get_time", {})],
        "llama_json",
    ),
    (
        '<|python_tag|>{"name": "search", "arguments": {"query": "llama"}}<|eom_id|>',
        "",
        [("search", {"query": "llama"})],
        "llama_json",
    ),
    (
        'Let me look that up.<|python_tag|>{"name": "search", "parameters": {"query": "x"}}',
        "Let me look that up.",
        [("search", {"query": "x"})],
        "llama_json",
    ),
    ('{"name": "get_time", "parameters": {}};', "", [("get_time", {})], "llama_json"),
]

MISTRAL: list[Case] = [
    (
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "",
        [W_PARIS],
        "mistral",
    ),
    (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": {"tz": "UTC"}}]',
        "",
        [W_PARIS, T_UTC],
        "mistral",
    ),
    ('[TOOL_CALLS]get_weather{"city": "Paris"}', "", [W_PARIS], "mistral"),
    (
        '[TOOL_CALLS]get_weather{"city": "Paris"}[TOOL_CALLS]get_time{}',
        "",
        [W_PARIS, ("get_time", {})],
        "mistral",
    ),
    (
        '[TOOL_CALLS]search[ARGS]{"query": "mistral small"}',
        "",
        [("search", {"query": "mistral small"})],
        "mistral",
    ),
    (
        'Let me check.[TOOL_CALLS]get_weather{"city": "Paris"}</s>',
        "Let me check.",
        [W_PARIS],
        "mistral",
    ),
    (
        '[TOOL_CALLS] [{"name": "search", "arguments": {"query": "x"}, "id": "abc123def"}]',
        "",
        [("search", {"query": "x"})],
        "mistral",
    ),
    (
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
        "",
        [W_PARIS],
        "mistral",
    ),
]

FUNCTION_TAG: list[Case] = [
    (
        '<function=get_weather>{"location": "Paris"}</function>',
        "",
        [("get_weather", {"location": "Paris"})],
        "function_tag",
    ),
    (
        '<function=get_weather>{"city": "Paris"}</function>'
        '<function=get_time>{"tz": "UTC"}</function>',
        "",
        [W_PARIS, T_UTC],
        "function_tag",
    ),
    (
        'I\'ll look it up.\n<function=search>{"query": "functionary"}</function>',
        "I'll look it up.",
        [("search", {"query": "functionary"})],
        "function_tag",
    ),
    ("<function=get_time>{}</function>", "", [("get_time", {})], "function_tag"),
    ("<function=get_time></function>", "", [("get_time", {})], "function_tag"),
    (
        '<function=write_file>{"path": "x.html", "content": "</function>}"}</function>',
        "",
        [("write_file", {"path": "x.html", "content": "</function>}"})],
        "function_tag",
    ),
    (
        '<function=search>\n{"query": "a"}\n</function>\n<function=search>\n{"query": "b"}\n'
        "</function><|eot_id|>",
        "",
        [("search", {"query": "a"}), ("search", {"query": "b"})],
        "function_tag",
    ),
]

PYTHONIC: list[Case] = [
    ('[get_weather(city="Paris"), get_time(tz="UTC")]', "", [W_PARIS, T_UTC], "pythonic"),
    (
        '[get_weather(city="San Francisco", unit="celsius")]',
        "",
        [("get_weather", {"city": "San Francisco", "unit": "celsius"})],
        "pythonic",
    ),
    (
        '<|python_start|>[search(query="llama 4")]<|python_end|>',
        "",
        [("search", {"query": "llama 4"})],
        "pythonic",
    ),
    ("[get_time()]", "", [("get_time", {})], "pythonic"),
    (
        '[calculator(expression="2*3", precision=2, exact=True, tags=["a", "b"], '
        'opts={"x": None})]',
        "",
        [
            (
                "calculator",
                {
                    "expression": "2*3",
                    "precision": 2,
                    "exact": True,
                    "tags": ["a", "b"],
                    "opts": {"x": None},
                },
            )
        ],
        "pythonic",
    ),
    (
        '  \n[search(query="x", limit=-1, span=(1, 2.5))]\n',
        "",
        [("search", {"query": "x", "limit": -1, "span": [1, 2.5]})],
        "pythonic",
    ),
    (
        "[\n  get_weather(city='Paris'),\n  get_time(tz='UTC')\n]",
        "",
        [W_PARIS, T_UTC],
        "pythonic",
    ),
]

BARE: list[Case] = [
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [W_PARIS], "bare_json"),
    (  # text after the call is dropped
        '\n\n{"name": "search", "arguments": {"query": "x"}}\n\nI called search.',
        "",
        [("search", {"query": "x"})],
        "bare_json",
    ),
    ('{"name": "get_time"}', "", [("get_time", {})], "bare_json"),
    (
        '{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}',
        "",
        [("search", {"query": "x"})],
        "bare_json",
    ),
    (
        '{"type": "function", "function": '
        '{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}}',
        "",
        [("search", {"query": "x"})],
        "bare_json",
    ),
    (
        '{"name": "get_time", "arguments": {}}\n{"name": "search", "arguments": {"query": "x"}}',
        "",
        [("get_time", {}), ("search", {"query": "x"})],
        "bare_json",
    ),
    (
        '{"arguments": {"query": "} <tool_call> ```"}, "name": "search"}',
        "",
        [("search", {"query": "} <tool_call> ```"})],
        "bare_json",
    ),
]

POSITIVE = HERMES + FENCED + LLAMA + MISTRAL + FUNCTION_TAG + PYTHONIC + BARE


def test_every_source_has_at_least_five_examples() -> None:
    counts = {s: sum(1 for case in POSITIVE if case[3] == s) for s in SOURCES}
    assert all(n >= 5 for n in counts.values()), counts


@pytest.mark.parametrize(("text", "content", "calls", "source"), POSITIVE)
def test_rescue(text: str, content: str, calls: list[Any], source: str) -> None:
    got = rescue_tool_calls(text, TOOLS)
    assert got == Rescued(content=content, calls=tuple(calls), source=source)


NEGATIVE: list[str] = [
    # JSON quoted in prose: bare JSON must start the output
    'Here is an example: {"name": "search", "arguments": {"query": "x"}}',
    'Use this shape:\n\n{"name": "get_time", "arguments": {}}',
    # unknown tool names, per format
    '<tool_call>\n{"name": "delete_everything", "arguments": {}}\n</tool_call>',
    '```json\n{"name": "delete_everything", "arguments": {}}\n```',
    '<|python_tag|>{"name": "delete_everything", "parameters": {}}',
    '{"name": "delete_everything", "parameters": {}}',
    '[TOOL_CALLS] [{"name": "delete_everything", "arguments": {}}]',
    "[TOOL_CALLS]delete_everything{}",
    "<function=delete_everything>{}</function>",
    "[delete_everything()]",
    '{"name": "delete_everything", "arguments": {}}',
    # several calls, one unknown: the whole block is rejected
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n'
    '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
    '[TOOL_CALLS]get_weather{"city": "Paris"}[TOOL_CALLS]rm_rf{}',
    '[get_weather(city="Paris"), rm_rf()]',
    '{"name": "get_time", "parameters": {}}; {"name": "rm_rf", "parameters": {}}',
    '```json\n[{"name": "get_time", "arguments": {}}, {"name": "rm_rf", "arguments": {}}]\n```',
    "<function=get_time>{}</function><function=rm_rf>{}</function>",
    # unterminated tags / fences
    '<tool_call>{"name":"get_time","arguments":{}}',
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "get_',
    '<tool_call>{"name": "search", "arguments": {"query": "</tool_call>"}}',
    "The reply ends with <tool_call>",
    'The format is <tool_call>{"name": ..., "arguments": ...}</tool_call>.',
    "<function=get_time>{}",
    '```json\n{"name": "get_time", "arguments": {}}',
    # malformed JSON
    '<tool_call>{"name": "search", "arguments": {"query": }}</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"query": "a"}}}</tool_call>',
    "{'name': 'search', 'arguments': {}}",
    "[TOOL_CALLS]get_weather{city: Paris}",
    '{"name": "search", "arguments": {"query": "x"}; {"name": "get_time"}',
    '{"name": "get_time", "parameters": {}}; {"name": "get_',
    # arguments that are not an object
    '{"name": "search", "arguments": [1, 2]}',
    '<tool_call>{"name": "search", "arguments": "not json"}</tool_call>',
    '<tool_call>{"name": "search", "arguments": 5}</tool_call>',
    '<tool_call>{"name": "search", "arguments": "[1]"}</tool_call>',
    '<function=search>["x"]</function>',
    # fenced JSON that is not a call
    '```json\n{"city": "Paris", "temp": 21}\n```',
    '```json\n{"name": "search", "description": "Search the web", "parameters": {}}\n```',
    "```json\n[1, 2, 3]\n```",
    "```json\n[]\n```",
    '```python\n{"name": "search", "arguments": {}}\n```',
    # non-literal / non-keyword pythonic arguments
    "[search(query=x)]",
    "[search(query=f())]",
    '[search("positional")]',
    "[search(**kw)]",
    '[obj.search(query="x")]',
    "[search(query={1, 2})]",
    "[search(query=b'x')]",
    '[search(query="x")] + [get_time()]',
    '[search(query="x")] and more text',
    # plain text, with and without brackets
    "The weather in Paris is sunny.",
    "[1] Smith et al. (2020) {see also} [2]",
    "[see the docs](https://example.com)",
    "{not json at all}",
    "[]",
    "a [b] {c} <d>",
    'Call it like `[search(query="x")]` in your code.',
    '<|python_tag|>brave_search.call(query="x")',
    "[TOOL_CALLS]",
    "",
]


@pytest.mark.parametrize("text", NEGATIVE)
def test_not_rescued(text: str) -> None:
    assert rescue_tool_calls(text, TOOLS) is None


@pytest.mark.parametrize(("text", "content", "calls", "source"), POSITIVE[::5])
def test_no_tool_names_means_no_rescue(text: str, content: str, calls: Any, source: str) -> None:
    assert rescue_tool_calls(text, TOOLS) is not None
    assert rescue_tool_calls(text, []) is None
    assert rescue_tool_calls(text, {"other"}) is None


def test_tool_names_may_be_any_collection() -> None:
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    for names in (["get_time"], ("get_time",), {"get_time": object()}.keys(), {"get_time"}):
        got = rescue_tool_calls(text, names)
        assert got is not None and got.calls == (("get_time", {}),)


def test_plain_text_is_fast() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 20_000  # ~900 KB
    t0 = time.perf_counter()
    for _ in range(10):
        assert rescue_tool_calls(text, TOOLS) is None
    assert time.perf_counter() - t0 < 1.0


# ---------------------------------------------------------------- streaming gate


def _run_gate(parts: list[str]) -> tuple[str, str, StreamGate]:
    gate = StreamGate(TOOLS)
    streamed = "".join(gate.feed(p) for p in parts)
    return streamed, gate.finish(), gate


def _expected_output(text: str) -> str:
    rescued = rescue_tool_calls(text, TOOLS)
    return text if rescued is None else rescued.content


GATE_TEXTS: list[str] = (
    [case[0] for case in POSITIVE]
    + NEGATIVE
    + [
        "Hello, world!\n\nHow are you?  ",
        "   \n\t",
        "Inline `code` and a ``double`` and a <b>tag</b> and [link](x) and <|im_end|>",
        "Use <tool and <function and [TOOL and <|python and ``",
        'Sure.  \n\n  <tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
    ]
)


@pytest.mark.parametrize("text", GATE_TEXTS)
def test_gate_char_by_char(text: str) -> None:
    streamed, tail, gate = _run_gate(list(text))
    assert streamed + tail == _expected_output(text)
    assert gate.rescued == rescue_tool_calls(text, TOOLS)


@pytest.mark.parametrize("text", GATE_TEXTS)
def test_gate_every_split_pair(text: str) -> None:
    expected = _expected_output(text)
    n = len(text)
    for i in range(n + 1):
        for j in range(i, n + 1):
            streamed, tail, _ = _run_gate([text[:i], text[i:j], text[j:]])
            assert streamed + tail == expected, (i, j)


def test_gate_emits_plain_text_immediately() -> None:
    gate = StreamGate(TOOLS)
    assert gate.feed("Hello") == "Hello"
    assert gate.feed(" there") == " there"
    assert gate.feed(", friend. ") == ", friend."  # trailing whitespace waits
    assert gate.feed("Bye") == " Bye"
    assert gate.finish() == ""
    assert gate.rescued is None


def test_gate_holds_partial_marker_then_releases() -> None:
    gate = StreamGate(TOOLS)
    assert gate.feed("Hi <to") == "Hi"
    assert gate.feed("day> is fine") == " <today> is fine"
    assert gate.finish() == ""


def test_gate_holds_partial_marker_then_tool_call() -> None:
    gate = StreamGate(TOOLS)
    assert gate.feed("Checking. <tool") == "Checking."
    assert gate.feed('_call>{"name": "get_time", "arguments": {}}') == ""
    assert gate.feed("</tool_call>") == ""
    assert gate.finish() == ""
    assert gate.rescued is not None
    assert gate.rescued.calls == (("get_time", {}),)
    assert gate.rescued.content == "Checking."


def test_gate_emits_prose_before_fence_and_holds_fence() -> None:
    gate = StreamGate(TOOLS)
    out = gate.feed("I will search now.\n")
    out += gate.feed("```json\n")
    assert out == "I will search now."
    assert gate.feed('{"name": "search", "arguments": {"query": "x"}}\n```') == ""
    assert gate.finish() == ""
    assert gate.rescued is not None and gate.rescued.source == "fenced_json"


def test_gate_releases_held_text_when_not_a_call() -> None:
    text = 'Example:\n```python\nprint("}")\n```\nThat is all.'
    gate = StreamGate(TOOLS)
    assert gate.feed(text) == "Example:"
    assert gate.feed(" More.") == ""  # after a marker everything waits for finish()
    assert gate.finish() == text[len("Example:") :] + " More."
    assert gate.rescued is None


def test_gate_holds_leading_bracket_and_whitespace() -> None:
    gate = StreamGate(TOOLS)
    assert gate.feed("  \n") == ""
    assert gate.feed("[get_") == ""
    assert gate.feed('weather(city="Paris")]') == ""
    assert gate.finish() == ""
    assert gate.rescued == Rescued("", (W_PARIS,), "pythonic")


def test_gate_leading_bracket_that_is_prose_comes_out_at_finish() -> None:
    gate = StreamGate(TOOLS)
    assert gate.feed("[1] A citation.") == ""
    assert gate.finish() == "[1] A citation."


def test_gate_finish_is_idempotent_and_feed_after_finish_is_ignored() -> None:
    gate = StreamGate(TOOLS)
    assert gate.feed("abc `") == "abc"
    assert gate.finish() == " `"
    assert gate.finish() == ""
    assert gate.feed("more") == ""
