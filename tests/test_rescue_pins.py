"""Pins for dsh/llm/rescue.py found by mutation testing (docs/testing.md): a rejected format
hands over to the next, the OpenAI wire shape, dict-valued pythonic arguments, unclosed
fences, and hostile text that must never raise out of ``rescue_tool_calls``."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from dsh.llm.rescue import MARKERS
from dsh.llm.rescue import Rescued
from dsh.llm.rescue import StreamGate
from dsh.llm.rescue import rescue_tool_calls

TOOLS = frozenset({"get_time", "search", "f"})
HERMES_CALL = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


# An earlier format finds a bad candidate and is rejected; a later one still gets its turn
# (the module docstring: "rejected as a whole and the next format is tried").
LATER_FORMAT: list[tuple[str, str, str]] = [
    # leading_json rejects (not a call) -> hermes
    ('{"note": 1}\n' + HERMES_CALL, '{"note": 1}', "hermes"),
    # mistral rejects (a name without JSON after it) -> hermes
    ("I will use [TOOL_CALLS] later.\n" + HERMES_CALL, "I will use [TOOL_CALLS] later.",
     "hermes"),
    # python_tag rejects (code, not JSON) -> function_tag
    ('<|python_tag|>x = 1\n<function=get_time>{}</function>', "<|python_tag|>x = 1",
     "function_tag"),
    # hermes rejects (unterminated) -> fenced_json
    ('<tool_call>{"name": "get_time"}\n```json\n{"name": "search", "arguments": {"q": 1}}\n```',
     '<tool_call>{"name": "get_time"}', "fenced_json"),
    # function_tag rejects (arguments not an object) -> fenced_json
    ('<function=f>[1]</function>\n```\n{"name": "f", "arguments": {}}\n```',
     "<function=f>[1]</function>", "fenced_json"),
    # pythonic rejects (positional argument) -> hermes, after the leading bracket
    ('[f(1)]\n' + HERMES_CALL, "[f(1)]", "hermes"),
]


@pytest.mark.parametrize(("text", "content", "source"), LATER_FORMAT)
def test_a_rejected_format_hands_over_to_the_next(text: str, content: str, source: str):
    got = rescue_tool_calls(text, TOOLS)
    assert got is not None, text
    assert (got.content, got.source) == (content, source)


OPENAI = {"id": "call_1", "type": "function",
          "function": {"name": "search", "arguments": json.dumps({"q": "x", "n": 2})}}


@pytest.mark.parametrize("text", [
    json.dumps(OPENAI),
    "```json\n" + json.dumps([OPENAI, {**OPENAI, "id": "call_2"}]) + "\n```",
    "<tool_call>" + json.dumps(OPENAI) + "</tool_call>",
    "```json\n" + json.dumps(OPENAI) + "\n```",
    "[TOOL_CALLS]" + json.dumps([OPENAI]),
])
def test_the_full_openai_tool_call_shape(text: str):
    got = rescue_tool_calls(text, TOOLS)
    assert got is not None
    assert got.calls and all(c == ("search", {"q": "x", "n": 2}) for c in got.calls)


@pytest.mark.parametrize("obj", [
    {**OPENAI, "index": 0},  # a key beyond id/type/function: data, not a call
    {"type": "function", "function": "search"},  # function not an object
    {"id": "x", "type": "function"},  # no function at all
    {"id": "x", "function": {"name": "search", "arguments": {}, "description": "d"}},
])
def test_near_openai_shapes_are_not_calls(obj: dict[str, Any]):
    assert rescue_tool_calls(json.dumps(obj), TOOLS) is None
    assert rescue_tool_calls("```json\n" + json.dumps(obj) + "\n```", TOOLS) is None


def test_openai_arguments_may_be_empty_or_null():
    for args in ("", "  ", None):
        obj = {"type": "function", "function": {"name": "get_time", "arguments": args}}
        got = rescue_tool_calls(json.dumps(obj), TOOLS)
        assert got == Rescued("", (("get_time", {}),), "bare_json")


def test_call_ids_and_types_beside_a_name_are_allowed():
    text = json.dumps({"id": "1", "type": "function", "name": "get_time", "arguments": {}})
    assert rescue_tool_calls(text, TOOLS) == Rescued("", (("get_time", {}),), "bare_json")


@pytest.mark.parametrize(("text", "args"), [
    ('[f(opts={"a": 1, "b": [1, (2, 3)]})]', {"opts": {"a": 1, "b": [1, [2, 3]]}}),
    ('[f(d={"k": {"n": None, "t": True, "x": 1.5}})]',
     {"d": {"k": {"n": None, "t": True, "x": 1.5}}}),
    ("[f(e={})]", {"e": {}}),
    ("[f(t=(1, 'a'), s='q')]", {"t": [1, "a"], "s": "q"}),
    ("<|python_start|>[f(a=-1)]<|python_end|>", {"a": -1}),
    ("<|python_start|>[f(a=2)]", {"a": 2}),
])
def test_pythonic_literal_arguments(text: str, args: dict[str, Any]):
    got = rescue_tool_calls(text, TOOLS)
    assert got == Rescued("", (("f", args),), "pythonic")


@pytest.mark.parametrize("text", [
    "[f(d={1: 2})]",  # a non-string key
    '[f(d={"a": {1, 2}})]',  # a set, nested
    '[f(d={"a": b"x"})]',  # bytes, nested
    "[f(d={'a': [1, {2: 3}]})]",
    "[f(a=1), 3]",  # an element that is not a call
    "[f(a=1) for f in g]",  # not a list display
    "[f(a=1), f(a=",  # unparseable
    "[f(a=1)] ]",
])
def test_pythonic_arguments_that_are_not_json_reject(text: str):
    assert rescue_tool_calls(text, TOOLS) is None


@pytest.mark.parametrize("text", [
    "```json\n",
    "```",
    "``` ",
    "look: ```",
    "```python\nprint(1)\n",
    '```json\n{"name": "f", "arguments": {}}',
    '```json\n{"name": "f", "arguments": {}}\n``',
    '```\n{"name": "f", "arguments": {}}\n',
    '```json\n{"name": "f", "arguments": {}',
    "```py\nx\n```\n```json\n{\"name\": \"f\"",
    "```a```b```c",
])
def test_unclosed_fences_end(text: str):
    assert rescue_tool_calls(text, TOOLS) is None


def test_a_call_fence_after_an_ordinary_fence():
    text = 'Run:\n```py\nx = 1\n```\nthen\n```json\n{"name": "f", "arguments": {"a": 1}}\n```'
    assert rescue_tool_calls(text, TOOLS) == Rescued(
        "Run:\n```py\nx = 1\n```\nthen", (("f", {"a": 1}),), "fenced_json")


def test_several_call_fences_and_prose_between():
    text = ('A\n```json\n{"name": "f", "arguments": {}}\n```\nand\n'
            '```tool_call\n[{"name": "search", "arguments": {"q": 1}}]\n```\ntrailing')
    assert rescue_tool_calls(text, TOOLS) == Rescued(
        "A", (("f", {}), ("search", {"q": 1})), "fenced_json")


def test_a_data_fence_before_a_call_fence_is_skipped():
    text = ('```json\n{"city": "Paris"}\n```\nso:\n```json\n{"name": "f", "arguments": {}}\n```')
    assert rescue_tool_calls(text, TOOLS) == Rescued(
        '```json\n{"city": "Paris"}\n```\nso:', (("f", {}),), "fenced_json")


def test_call_fences_from_the_first_byte():
    text = ('```json\n{"name": "f", "arguments": {}}\n```\n'
            '```json\n{"name": "get_time", "arguments": {}}\n```')
    assert rescue_tool_calls(text, TOOLS) == Rescued(
        "", (("f", {}), ("get_time", {})), "fenced_json")


@pytest.mark.parametrize(("text", "calls", "source"), [
    ('{"name": "f", "parameters": {}};{"name": "get_time", "parameters": {}}',
     [("f", {}), ("get_time", {})], "llama_json"),
    ('<|python_tag|>{"name": "f", "parameters": {}}\n{"name": "get_time", "parameters": {}}',
     [("f", {}), ("get_time", {})], "llama_json"),
    ('{"name": "f", "arguments": {}}\n{"other": 1}', [("f", {})], "bare_json"),
    ('{"name": "f", "arguments": {}}\n[1, 2]', [("f", {})], "bare_json"),
])
def test_json_call_sequences(text: str, calls: list[Any], source: str):
    got = rescue_tool_calls(text, TOOLS)
    assert got is not None and (list(got.calls), got.source) == (calls, source)


def test_a_call_shaped_fence_without_its_closing_fence_rejects_the_format():
    text = 'x\n```json\n{"name": "f", "arguments": {}} trailing words\n```'
    assert rescue_tool_calls(text, TOOLS) is None


# Hostile and malformed text: never an exception out of rescue, never a hang.
MALFORMED = [
    "[TOOL_CALLS]" + "[" * 5000,
    "<tool_call>" + "{" * 5000,
    "```json\n" + "[" * 5000 + "\n```",
    "[f(a=" + "[" * 500 + "]" * 500 + ")]",
    "[f(a=" + "(" * 5000 + ")]",
    "<function=f>" + '{"a":' * 3000 + "1" + "}" * 3000 + "</function>",
    "{" * 100_000,
    "[" + "f(a=1)," * 5 + "f(a=1e999999)]",
    '{"name": "f", "arguments": "' + "[" * 5000 + '"}',
    "<|python_tag|>" + '{"name": "f", "parameters": {}};' * 3,
    '{"name": "f", "parameters": {}};',
    '{"name": "f", "arguments": {}}\n{"name": 1}',
    '{"name": "f", "arguments": {}}\n{"nam',
    "[TOOL_CALLS]f[CALL_ID]abc[ARGS]{}",
    "[TOOL_CALLS]f[ARGS]",
    "\x00<tool_call>\ud800{}</tool_call>",
]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_input_never_raises(text: str):
    got = rescue_tool_calls(text, TOOLS)
    assert got is None or isinstance(got, Rescued)


def test_malformed_results_are_exact():
    got = rescue_tool_calls("[TOOL_CALLS]f[CALL_ID]abc[ARGS]{}", TOOLS)
    assert got == Rescued("", (("f", {}),), "mistral")
    assert rescue_tool_calls('{"name": "f", "parameters": {}};', TOOLS) == Rescued(
        "", (("f", {}),), "llama_json")
    assert rescue_tool_calls('{"name": "f", "arguments": {}}\n{"name": 1}', TOOLS) is None
    got = rescue_tool_calls('{"name": "f", "arguments": {}}\n{"nam', TOOLS)
    assert got == Rescued("", (("f", {}),), "bare_json")


#: Fewer generated examples under mutation testing, where these run once per mutant.
SCALE = 8 if "MUTANT_UNDER_TEST" in os.environ else 1

pieces = st.sampled_from([
    *MARKERS, "<|python_end|>", "</tool_call>", "</function>", "[ARGS]", "[CALL_ID]",
    "{", "}", "[", "]", "(", ")", '"', ":", ",", ";", "=", "\n", " ", "f", "get_time",
    '"name"', '"arguments"', '"parameters"', '"function"', "json", "1", "null", "\\",
])
hostile = st.lists(pieces | st.text(max_size=4), max_size=40).map("".join)


@settings(max_examples=400 // SCALE, deadline=None)
@given(hostile)
def test_generated_hostile_text_never_raises(text: str):
    got = rescue_tool_calls(text, TOOLS)
    if got is not None:
        assert text.startswith(got.content) or got.content == text[: len(got.content)]
        assert all(name in TOOLS and isinstance(args, dict) for name, args in got.calls)


@settings(max_examples=300 // SCALE, deadline=None)
@given(st.text())
def test_arbitrary_text_never_raises(text: str):
    rescue_tool_calls(text, TOOLS)


@settings(max_examples=200 // SCALE, deadline=None)
@given(hostile, st.lists(st.integers(1, 7), max_size=10))
def test_the_gate_shows_exactly_the_content(text: str, cuts: list[int]):
    gate = StreamGate(TOOLS)
    shown, pos = [], 0
    for n in cuts:
        shown.append(gate.feed(text[pos:pos + n]))
        pos += n
    shown.append(gate.feed(text[pos:]))
    shown.append(gate.finish())
    out = "".join(shown)
    assert out == (gate.rescued.content if gate.rescued is not None else text)
