"""Text that cannot be written as UTF-8, made writable at the edges (docs/events.md, "sanitized").

A Python ``str`` can hold code points no UTF-8 encoder accepts: lone surrogates
(``U+D800``–``U+DFFF``). They arrive from a model (a JSON ``"\\ud800"`` escape, or a surrogate
pair split across two streamed deltas) and from the command line (bytes that are not UTF-8
become ``U+DC80``–``U+DCFF`` through Python's ``surrogateescape``). Left alone they make the
ledger write, the provider request or the terminal write fail, and the answer is lost.

The rule everywhere: first *join* a high surrogate followed by a low one into the character
they encode (lossless: JSON's ``"\\ud83d\\ude00"`` is 😀), then *replace* every surrogate left
with U+FFFD. :func:`clean_text` returns how many were replaced, so the ledger can record it.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
#: A high surrogate at the very end of a streamed delta: its low half may come next.
_HIGH_AT_END = re.compile("[\ud800-\udbff]\\Z")


def has_surrogates(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def clean_text(text: str) -> tuple[str, int]:
    """``(text, replaced)``: pairs joined, every lone surrogate replaced by U+FFFD."""
    if _SURROGATE.search(text) is None:
        return text, 0
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return _SURROGATE.subn(REPLACEMENT, joined)


def join_pairs(text: str) -> str:
    """Only the lossless half: a high + low surrogate becomes one character; lone ones stay."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def clean_value(value: Any) -> tuple[Any, int]:
    """:func:`clean_text` applied to every string inside ``value`` (dict keys included, and
    the fields of attrs instances); ``(value, replaced)``. The same object comes back when
    nothing had to change (a joined pair is a change, though not a replacement)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        total = 0
        changed = False
        out = {}
        for k, v in value.items():
            k2, n1 = clean_value(k)
            v2, n2 = clean_value(v)
            out[k2] = v2
            total += n1 + n2
            changed = changed or k2 is not k or v2 is not v
        return (out, total) if changed else (value, 0)
    if isinstance(value, (list, tuple)):
        items = [clean_value(v) for v in value]
        if all(v2 is v for (v2, _), v in zip(items, value, strict=True)):
            return value, 0
        cleaned = [v for v, _ in items]
        total = sum(n for _, n in items)
        return (tuple(cleaned) if isinstance(value, tuple) else cleaned), total
    if attrs.has(type(value)):
        changes = {}
        total = 0
        for f in attrs.fields(type(value)):
            if not f.init:
                continue
            old = getattr(value, f.name)
            v2, n = clean_value(old)
            if v2 is not old:
                changes[f.alias or f.name] = v2
                total += n
        return (attrs.evolve(value, **changes), total) if changes else (value, 0)
    return value, 0


class StreamText:
    """Streamed text deltas made safe to print as they arrive: a high surrogate ending one
    delta is held back and joined with a low surrogate starting the next (a pair split by the
    stream), then whatever is still lone becomes U+FFFD. :meth:`flush` releases a held one."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = ""

    def feed(self, delta: str) -> str:
        if self._held:
            delta, self._held = self._held + delta, ""
        elif _SURROGATE.search(delta) is None:
            return delta  # the normal case: one regex scan, nothing else
        if _HIGH_AT_END.search(delta):
            delta, self._held = delta[:-1], delta[-1]
        return clean_text(delta)[0]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return clean_text(held)[0]


def nesting_depth(value: Any, limit: int) -> int:
    """How deeply lists and dicts nest in ``value``, counted without recursion; stops early
    and returns ``limit + 1`` once ``limit`` is passed."""
    depth = 0
    level = [value]
    while level:
        nxt: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, (list, tuple)):
                nxt.extend(v)
        if not nxt and not any(isinstance(v, (dict, list, tuple)) for v in level):
            break
        depth += 1
        if depth > limit:
            return depth
        level = nxt
    return depth


# -- JSON that other readers can read back: no NaN, no infinities ------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is out of range for a JSON number")
    return value


def loads_strict(text: str | bytes) -> Any:
    """``json.loads`` without Python's extensions: ``NaN``, ``Infinity`` and numbers that
    overflow to infinity (``1e999``) raise ``ValueError``. What dsh takes from a provider
    (and records) must be JSON every other reader accepts, and that the next request can
    carry."""
    global _STRICT
    if _STRICT is None:
        import json

        _STRICT = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)
    if isinstance(text, bytes | bytearray):
        import json

        text = bytes(text).decode(json.detect_encoding(text), "surrogatepass")
    return _STRICT.decode(text)


_STRICT: Any = None


def has_nonfinite(value: Any) -> bool:
    """Whether a NaN or an infinity is anywhere in ``value`` (dicts, lists, tuples), walked
    without recursion."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                return True
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return False


# -- one line: an error message that a plugin's or a server's text cannot split -----------------


def one_line(message: str) -> str:
    """``message`` on one line: each line break (``\\n``, ``\\r`` and every other one
    ``str.splitlines`` knows) shown as the two characters ``\\n``, so text from a plugin or a
    server can never print a second ``dsh: error:`` line of its own."""
    lines = message.strip().splitlines()
    return "\\n".join(lines) if len(lines) > 1 else (lines[0] if lines else "")
