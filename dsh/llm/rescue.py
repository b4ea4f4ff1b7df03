"""Rescue tool calls that a model wrote as text (MISSION D5).

Small and local models often answer a tool-enabled request with the call written into the
text instead of as a native tool call. :func:`rescue_tool_calls` recognises the formats
models actually emit and returns the calls plus the prose before them; :class:`StreamGate`
holds back streamed text that may turn out to be such a call, so it is never printed as
the answer.

Formats (the ``source`` recorded on :class:`Rescued`), tried in this order:

* ``pythonic``     ``[f(a=1), g()]``, the whole output, optionally in ``<|python_start|>``
* ``llama_json`` / ``bare_json``  a JSON call object that starts the output; ``llama_json``
  when any object uses ``"parameters"`` or calls are separated by ``;``, else ``bare_json``
* ``mistral``      ``[TOOL_CALLS][{...}]`` or ``[TOOL_CALLS]name{...}`` / ``name[ARGS]{...}``
* ``llama_json``   ``<|python_tag|>{"name": ..., "parameters": ...}`` (``;``-separated)
* ``hermes``       ``<tool_call>{...}</tool_call>`` blocks
* ``function_tag`` ``<function=name>{...}</function>`` blocks
* ``fenced_json``  a ```json (or bare ```) fence holding a call object or a list of them

Start-anchored formats go first: a call that starts the output owns everything after it, so
markers quoted inside its JSON strings cannot be mistaken for calls. A format that finds a
bad candidate (unknown name, malformed JSON, unterminated tag, non-object arguments) is
rejected as a whole and the next format is tried. Text after the last call is dropped.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from collections.abc import Collection
from typing import Any

import attrs

__all__ = ["MARKERS", "SOURCES", "Rescued", "StreamGate", "rescue_tool_calls"]

SOURCES = (
    "hermes",
    "fenced_json",
    "llama_json",
    "mistral",
    "function_tag",
    "pythonic",
    "bare_json",
)

_TOOL_CALL, _TOOL_CALL_END = "<tool_call>", "</tool_call>"
_FUNCTION, _FUNCTION_END = "<function=", "</function>"
_PYTHON_START, _PYTHON_END = "<|python_start|>", "<|python_end|>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL = "[TOOL_CALLS]"
_FENCE = "```"
#: Every rescued call starts at one of these, or at a ``{`` / ``[`` that starts the output.
MARKERS = (_TOOL_CALL, _FENCE, _PYTHON_TAG, _PYTHON_START, _MISTRAL, _FUNCTION)

_WS = re.compile(r"\s*")
_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_FUNCTION_OPEN = re.compile(r"<function=([A-Za-z_][\w.\-]*)>")
_MISTRAL_ARGS = re.compile(r"\s*(?:\[CALL_ID\]\s*[\w\-]+\s*)?(?:\[ARGS\])?\s*")
_FENCE_OPEN = re.compile(r"```[ \t]*([\w+.\-]*)")
_DANGLING_FENCE = re.compile(r"```[\w+.\-]*$")
_PYTHONIC = re.compile(r"\[\s*[A-Za-z_]\w*\s*\(")
_JSON_LANGS = frozenset({"", "json", "jsonc", "json5", "tool_call", "tool_calls"})
_CALL_KEYS = frozenset({"name", "arguments", "parameters", "id", "type"})
_OPENAI_KEYS = frozenset({"function", "id", "type"})
_DECODER = json.JSONDecoder()

Call = tuple[str, dict[str, Any]]


@attrs.frozen
class Rescued:
    """Tool calls recovered from a response's text."""

    content: str  # text before the call(s), trailing whitespace stripped
    calls: tuple[tuple[str, dict[str, Any]], ...]  # (name, arguments) in order
    source: str  # one of SOURCES


class _Reject(Exception):
    """The candidate is not a valid call: reject this format as a whole."""


def _skip(text: str, pos: int, pattern: re.Pattern[str] = _WS) -> int:
    """Position after ``pattern`` (which matches the empty string) at ``pos``."""
    m = pattern.match(text, pos)
    return m.end() if m else pos


def _decode(text: str, pos: int) -> tuple[Any, int]:
    # raw_decode parses exactly one value from pos and is string-aware: a "}" or a closing
    # tag inside a JSON string never ends the object early.
    try:
        return _DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError) as exc:
        raise _Reject from exc


def _arguments(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):  # OpenAI-style: a JSON-encoded object
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise _Reject from exc
    if not isinstance(value, dict):
        raise _Reject
    return value


def _named(name: Any, args: Any, names: frozenset[str]) -> Call:
    if not isinstance(name, str) or name not in names:
        raise _Reject
    return name, _arguments(args)


def _unwrap(obj: Any) -> Any:
    # OpenAI wire shape {"type": "function", "function": {"name": ..., "arguments": "..."}}
    if isinstance(obj, dict) and obj.keys() <= _OPENAI_KEYS:
        if isinstance(obj.get("function"), dict):
            return obj["function"]
    return obj


def _is_call(obj: Any) -> bool:
    # Extra keys (e.g. "description") mean a quoted tool schema or data, not a call.
    obj = _unwrap(obj)
    return isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj.keys() <= _CALL_KEYS


def _looks_like_calls(value: Any) -> bool:
    items = value if isinstance(value, list) else [value]
    return bool(items) and all(_is_call(o) for o in items)


def _from_value(value: Any, names: frozenset[str]) -> list[Call]:
    if not _looks_like_calls(value):
        raise _Reject
    calls = []
    for obj in value if isinstance(value, list) else [value]:
        obj = _unwrap(obj)
        args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
        calls.append(_named(obj["name"], args, names))
    return calls


def _content(text: str, start: int) -> str:
    before = text[:start].rstrip()
    # A model that wraps e.g. a <tool_call> in a code fence leaves the opening fence behind.
    m = _DANGLING_FENCE.search(before)
    if m and before.count(_FENCE) % 2 == 1:
        before = before[: m.start()].rstrip()
    return before


def _pythonic(text: str, names: frozenset[str]) -> Rescued | None:
    s = text.strip()
    if s.startswith(_PYTHON_START):  # Llama 4; a missing <|python_end|> is tolerated
        s = s[len(_PYTHON_START) :].strip().removesuffix(_PYTHON_END).strip()
    if not (_PYTHONIC.match(s) and s.endswith("]")):
        return None
    try:
        tree = ast.parse(s, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise _Reject from exc
    if not isinstance(tree.body, ast.List):  # e.g. "[f()] + [g()]"
        raise _Reject
    calls = []
    for node in tree.body.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            raise _Reject
        args: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:  # **kwargs
                raise _Reject
            try:
                args[kw.arg] = _plain(ast.literal_eval(kw.value))
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
                raise _Reject from exc
        calls.append(_named(node.func.id, args, names))
    return Rescued("", tuple(calls), "pythonic")


def _plain(value: Any) -> Any:
    """JSON-compatible copy of a Python literal (tuples become lists); sets/bytes rejected."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise _Reject
        return {k: _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float):  # bool is an int
        return value
    raise _Reject


def _json_sequence(text: str, pos: int, names: frozenset[str]) -> tuple[list[Call], bool]:
    """Parse call objects from ``pos``; return them and whether Llama features were seen."""
    calls: list[Call] = []
    llama = False
    while True:
        value, end = _decode(text, pos)
        llama = llama or (isinstance(value, dict) and "parameters" in value)
        calls.extend(_from_value(value, names))
        p = _skip(text, end)
        if text.startswith(";", p):  # Llama 3 separates calls with ";"; the next must parse
            llama = True
            pos = _skip(text, p + 1)
            if not text.startswith("{", pos):
                break  # a trailing ";"
            continue
        if text.startswith("{", p):  # another call on the next line; anything else ends it
            try:
                nxt, _ = _DECODER.raw_decode(text, p)
            except (ValueError, RecursionError):
                break
            if isinstance(nxt, dict) and "name" in nxt:
                pos = p
                continue
        break
    return calls, llama


def _leading_json(text: str, names: frozenset[str]) -> Rescued | None:
    start = len(text) - len(text.lstrip())
    if not text.startswith("{", start):
        return None  # JSON quoted in prose is never a call
    calls, llama = _json_sequence(text, start, names)
    return Rescued("", tuple(calls), "llama_json" if llama else "bare_json")


def _python_tag(text: str, names: frozenset[str]) -> Rescued | None:
    start = text.find(_PYTHON_TAG)
    if start < 0:
        return None
    pos = _skip(text, start + len(_PYTHON_TAG))
    if not text.startswith("{", pos):  # code for a built-in tool, not a JSON call
        raise _Reject
    calls, _ = _json_sequence(text, pos, names)
    return Rescued(_content(text, start), tuple(calls), "llama_json")


def _mistral(text: str, names: frozenset[str]) -> Rescued | None:
    start = pos = text.find(_MISTRAL)
    if start < 0:
        return None
    calls: list[Call] = []
    while pos >= 0:
        p = _skip(text, pos + len(_MISTRAL))
        if text.startswith(("[", "{"), p):  # v3: a JSON list of call objects
            value, end = _decode(text, p)
            calls.extend(_from_value(value, names))
        else:  # v11+: name{args}, name[ARGS]{args}, name[CALL_ID]id[ARGS]{args}
            m = _NAME.match(text, p)
            if not m:
                raise _Reject
            args, end = _decode(text, _skip(text, m.end(), _MISTRAL_ARGS))
            if not isinstance(args, dict):
                raise _Reject
            calls.append(_named(m.group(), args, names))
        pos = text.find(_MISTRAL, end)
    return Rescued(_content(text, start), tuple(calls), "mistral")


def _hermes_open(text: str, pos: int) -> int:
    """The next ``<tool_call>`` followed by JSON; a bare mention of the tag is prose."""
    while (pos := text.find(_TOOL_CALL, pos)) >= 0:
        if text.startswith(("{", "["), _skip(text, pos + len(_TOOL_CALL))):
            return pos
        pos += len(_TOOL_CALL)
    return -1


def _hermes(text: str, names: frozenset[str]) -> Rescued | None:
    start = pos = _hermes_open(text, 0)
    if start < 0:
        return None
    calls: list[Call] = []
    while pos >= 0:
        value, end = _decode(text, _skip(text, pos + len(_TOOL_CALL)))
        end = _skip(text, end)
        if not text.startswith(_TOOL_CALL_END, end):  # unterminated (truncated?) or junk
            raise _Reject
        calls.extend(_from_value(value, names))
        pos = _hermes_open(text, end + len(_TOOL_CALL_END))
    return Rescued(_content(text, start), tuple(calls), "hermes")


def _function_tag(text: str, names: frozenset[str]) -> Rescued | None:
    start = pos = text.find(_FUNCTION)
    if start < 0:
        return None
    calls: list[Call] = []
    while pos >= 0:
        m = _FUNCTION_OPEN.match(text, pos)
        if not m:
            raise _Reject
        end = _skip(text, m.end())
        args: Any = {}
        if not text.startswith(_FUNCTION_END, end):
            args, end = _decode(text, end)
            end = _skip(text, end)
        if not isinstance(args, dict) or not text.startswith(_FUNCTION_END, end):
            raise _Reject
        calls.append(_named(m.group(1), args, names))
        pos = text.find(_FUNCTION, end + len(_FUNCTION_END))
    return Rescued(_content(text, start), tuple(calls), "function_tag")


def _fenced(text: str, names: frozenset[str]) -> Rescued | None:
    first = -1
    calls: list[Call] = []
    pos = text.find(_FENCE)
    while pos >= 0:
        m = _FENCE_OPEN.match(text, pos)
        lang, body = (m.group(1).lower(), m.end()) if m else ("", pos + len(_FENCE))
        p = _skip(text, body)
        if lang in _JSON_LANGS and text.startswith(("{", "["), p):
            try:
                value, end = _DECODER.raw_decode(text, p)
            except (ValueError, RecursionError):
                value = None
            if value is not None and _looks_like_calls(value):
                end = _skip(text, end)
                if not text.startswith(_FENCE, end):
                    raise _Reject
                calls.extend(_from_value(value, names))
                first = pos if first < 0 else first
                pos = text.find(_FENCE, end + len(_FENCE))
                continue
        close = text.find(_FENCE, body)  # an ordinary fence: skip past its closing fence
        pos = -1 if close < 0 else text.find(_FENCE, close + len(_FENCE))
    if not calls:
        return None
    return Rescued(_content(text, first), tuple(calls), "fenced_json")


_PARSERS: tuple[Callable[[str, frozenset[str]], Rescued | None], ...] = (
    _pythonic,
    _leading_json,
    _mistral,
    _python_tag,
    _hermes,
    _function_tag,
    _fenced,
)


def rescue_tool_calls(text: str, tool_names: Collection[str]) -> Rescued | None:
    """Return the tool calls written as text in ``text``, or None if it is plain text.

    Only calls to names in ``tool_names`` are accepted; one unknown name rejects the format.
    """
    names = frozenset(tool_names)
    head = text.lstrip()[:1]
    # Cheap pre-check so that plain prose costs a few substring scans.
    if not names or (head not in ("{", "[") and not any(m in text for m in MARKERS)):
        return None
    for parse in _PARSERS:
        try:
            rescued = parse(text, names)
        except _Reject:
            continue
        if rescued is not None:
            return rescued
    return None


class StreamGate:
    """Feeds streamed text deltas; returns the part that is safe to show now.

    Text is held from the earliest position where a marker begins (or may begin: a marker
    prefix at the end of the buffer, or a leading ``{`` / ``[``), and trailing whitespace is
    held too, because :attr:`Rescued.content` is right-stripped. Hence everything emitted
    concatenates to ``Rescued.content`` when the full text is rescued, and to the full text
    when it is not. Once a whole marker is seen, everything after it is held until
    :meth:`finish`.
    """

    _LONGEST = max(len(m) for m in MARKERS)

    def __init__(self, tool_names: Collection[str]) -> None:
        self._names = frozenset(tool_names)
        self._chunks: list[str] = []
        self._pending = ""  # not yet emitted, while not holding
        self._emitted = 0
        self._started = False  # a non-whitespace character has been seen
        self._holding = False
        self._finished = False
        #: The rescue result, set by :meth:`finish`.
        self.rescued: Rescued | None = None

    def feed(self, delta: str) -> str:
        """Add ``delta``; return the text safe to emit now (may be "")."""
        if not delta or self._finished:
            return ""
        self._chunks.append(delta)
        if self._holding:
            return ""
        pending = self._pending + delta
        if not self._started:
            stripped = pending.lstrip()
            if not stripped:
                self._pending = pending
                return ""
            self._started = True
            if stripped[0] in "{[":  # bare JSON / pythonic / Mistral start the output
                self._holding = True
                return ""
        cut = min((i for i in (pending.find(m) for m in MARKERS) if i >= 0), default=-1)
        if cut >= 0:
            self._holding = True
        else:
            cut = self._partial_marker(pending)
        out = pending[:cut].rstrip()
        self._pending = pending[len(out) :]
        self._emitted += len(out)
        return out

    def _partial_marker(self, text: str) -> int:
        """Start of the earliest suffix of ``text`` that is a proper prefix of a marker."""
        for i in range(max(0, len(text) - self._LONGEST + 1), len(text)):
            tail = text[i:]
            if any(m.startswith(tail) for m in MARKERS):
                return i
        return len(text)

    def finish(self) -> str:
        """End of stream: return the held text that belongs to the answer."""
        if self._finished:
            return ""
        self._finished = True
        text = "".join(self._chunks)
        self.rescued = rescue_tool_calls(text, self._names)
        if self.rescued is None:
            return text[self._emitted :]
        # The content starts with everything emitted: held text begins at or before the call.
        return self.rescued.content[self._emitted :]
