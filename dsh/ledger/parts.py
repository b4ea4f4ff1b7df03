"""The nested parts of ledger lines — tool calls, usage, reasoning, attachments, fragments, changes,
messages, tool specs — written and read back with every field's type checked.

:mod:`dsh.ledger.serialize` (the one place events become JSON and back) generates its fast
dumpers and loaders over these; a part of the wrong shape raises :class:`InvalidLine`, and
cattrs then explains the line. Kept apart so the generator reads as one page.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsh.core.messages import Attachment
from dsh.core.messages import Change
from dsh.core.messages import FragmentRef
from dsh.core.messages import Message
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage


class InvalidLine(Exception):
    """A field of the wrong shape, found by a fast loader (cattrs then explains it)."""


_Invalid = InvalidLine


def checked(value: Any, type_: type) -> Any:
    """``value`` if it is exactly of ``type_`` (JSON has no subclasses), else InvalidLine."""
    if type(value) is not type_:
        raise InvalidLine
    return value


def _check(ok: bool) -> None:
    if not ok:
        raise _Invalid


def raw_tool_calls(v: Any) -> tuple[ToolCall, ...]:
    _check(type(v) is list)
    out = []
    for c in v:
        _check(type(c) is dict and type(c["id"]) is str and type(c["name"]) is str
               and type(c.get("arguments", {})) is dict)
        out.append(ToolCall(id=c["id"], name=c["name"], arguments=c.get("arguments", {})))
    return tuple(out)


def dump_usage(u: Usage) -> dict[str, int]:
    """A usage object; the cache counts only when there are any (most lines have none)."""
    d = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}
    if u.cache_read_tokens or u.cache_write_tokens:
        d["cache_read_tokens"] = u.cache_read_tokens
        d["cache_write_tokens"] = u.cache_write_tokens
    return d


def dump_reasoning(parts: tuple[Reasoning, ...]) -> list[dict[str, Any]]:
    """Reasoning parts as JSON objects, every field written (they are replayed byte for
    byte)."""
    return [{"kind": r.kind, "provider": r.provider, "text": r.text, "signature": r.signature,
             "data": r.data, "id": r.id} for r in parts]


def dump_attachments(parts: tuple[Attachment, ...]) -> list[dict[str, Any]]:
    return [{"sha256": a.sha256, "media_type": a.media_type, "size": a.size, "name": a.name}
            for a in parts]


def dump_fragments(parts: tuple[FragmentRef, ...]) -> list[dict[str, Any]]:
    return [{"sha256": f.sha256, "size": f.size, "name": f.name} for f in parts]


def dump_changes(parts: tuple[Change, ...]) -> list[dict[str, Any]]:
    """A tool result's changes (:class:`~dsh.core.messages.Change`) as JSON objects; the
    optional fields only when set, so a plain update's line stays short."""
    out = []
    for c in parts:
        d: dict[str, Any] = {"path": c.path, "op": c.op, "diff": c.diff, "added": c.added,
                             "removed": c.removed}
        if c.moved_to is not None:
            d["moved_to"] = c.moved_to
        if c.before_sha256 is not None:
            d["before_sha256"] = c.before_sha256
        if c.after_sha256 is not None:
            d["after_sha256"] = c.after_sha256
        if not c.complete:
            d["complete"] = False
        out.append(d)
    return out


def dump_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages as JSON objects (``context/compacted``), every field written."""
    return [{"role": m.role, "content": m.content,
             "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                            for c in m.tool_calls],
             "tool_call_id": m.tool_call_id, "name": m.name, "is_error": m.is_error,
             "reasoning": dump_reasoning(m.reasoning),
             "attachments": dump_attachments(m.attachments)}
            for m in messages]


def raw_messages(v: Any) -> tuple[Message, ...]:
    """The inverse of :func:`dump_messages`, checking every field's type."""
    _check(type(v) is list)
    out = []
    for d in v:
        _check(type(d) is dict and type(d["role"]) is str
               and type(d.get("content", "")) is str
               and type(d.get("tool_call_id")) in (str, type(None))
               and type(d.get("name")) in (str, type(None))
               and type(d.get("is_error", False)) is bool)
        out.append(Message(role=d["role"], content=d.get("content", ""),
                           tool_calls=raw_tool_calls(d.get("tool_calls", [])),
                           tool_call_id=d.get("tool_call_id"), name=d.get("name"),
                           is_error=d.get("is_error", False),
                           reasoning=raw_reasoning(d.get("reasoning", [])),
                           attachments=raw_attachments(d.get("attachments", []))))
    return tuple(out)


def _usage(v: Any) -> Usage:
    _check(type(v) is dict)
    i, o = v.get("input_tokens", 0), v.get("output_tokens", 0)
    r, w = v.get("cache_read_tokens", 0), v.get("cache_write_tokens", 0)
    _check(type(i) is int and type(o) is int and type(r) is int and type(w) is int)
    if r or w:
        return Usage(input_tokens=i, output_tokens=o, cache_read_tokens=r, cache_write_tokens=w)
    return Usage(input_tokens=i, output_tokens=o)


_OPTIONAL_STR = (str, type(None))


def _raw_parts(v: Any, build: Callable[[Any], Any]) -> tuple[Any, ...]:
    """A list field most lines lack: ``()`` for the caller's default, else each item built
    (and checked) by ``build``."""
    if type(v) is not list:
        _check(v == ())  # only the caller's default; JSON gives lists
        return ()
    return tuple(build(item) for item in v) if v else ()


def _reasoning_part(r: Any) -> Reasoning:
    _check(type(r) is dict and type(r["kind"]) is str and type(r["provider"]) is str
           and type(r.get("text", "")) is str
           and type(r.get("signature")) in _OPTIONAL_STR
           and type(r.get("data")) in _OPTIONAL_STR
           and type(r.get("id")) in _OPTIONAL_STR)
    return Reasoning(kind=r["kind"], provider=r["provider"], text=r.get("text", ""),
                     signature=r.get("signature"), data=r.get("data"), id=r.get("id"))


def _attachment(a: Any) -> Attachment:
    _check(type(a) is dict and type(a["sha256"]) is str and type(a["media_type"]) is str
           and type(a["size"]) is int and type(a.get("name")) in _OPTIONAL_STR)
    return Attachment(sha256=a["sha256"], media_type=a["media_type"], size=a["size"],
                      name=a.get("name"))


#: A fragment's blob name: 64 lower-case hex digits (a ledger line naming ``../x`` is invalid).
_SHA256_HEX = frozenset("0123456789abcdef")


def _fragment(f: Any) -> FragmentRef:
    _check(type(f) is dict and type(f["sha256"]) is str and type(f["size"]) is int
           and type(f["name"]) is str)
    if len(f["sha256"]) != 64 or not _SHA256_HEX.issuperset(f["sha256"]):
        raise _Invalid("fragments", f"sha256 {f['sha256'][:80]!r} is not 64 lower-case hex "
                       "digits")
    return FragmentRef(sha256=f["sha256"], size=f["size"], name=f["name"])


#: The operations a recorded change may name.
CHANGE_OPS = frozenset({"add", "update", "delete", "move"})


def _change(c: Any) -> Change:
    _check(type(c) is dict and type(c["path"]) is str and c["op"] in CHANGE_OPS
           and type(c.get("diff", "")) is str and type(c.get("added", 0)) is int
           and type(c.get("removed", 0)) is int
           and type(c.get("moved_to")) in _OPTIONAL_STR
           and type(c.get("before_sha256")) in _OPTIONAL_STR
           and type(c.get("after_sha256")) in _OPTIONAL_STR
           and type(c.get("complete", True)) is bool)
    return Change(path=c["path"], op=c["op"], diff=c.get("diff", ""), added=c.get("added", 0),
                  removed=c.get("removed", 0), moved_to=c.get("moved_to"),
                  before_sha256=c.get("before_sha256"), after_sha256=c.get("after_sha256"),
                  complete=c.get("complete", True))


def raw_changes(v: Any) -> tuple[Change, ...]:
    """A tool result's recorded changes from JSON, checking every field's type."""
    return _raw_parts(v, _change)


def raw_reasoning(v: Any) -> tuple[Reasoning, ...]:
    """Reasoning parts from JSON, checking every field's type."""
    return _raw_parts(v, _reasoning_part)


def raw_attachments(v: Any) -> tuple[Attachment, ...]:
    """Attachment references from JSON, checking every field's type."""
    return _raw_parts(v, _attachment)


def raw_fragments(v: Any) -> tuple[FragmentRef, ...]:
    """Fragment references from JSON, checking every field's type."""
    return _raw_parts(v, _fragment)


def raw_tools(v: Any) -> tuple[ToolSpec, ...] | None:
    if v is None:
        return None
    _check(type(v) is list)
    out = []
    for t in v:
        _check(type(t) is dict and type(t["name"]) is str
               and type(t.get("description", "")) is str
               and type(t.get("parameters", {})) is dict)
        out.append(ToolSpec(name=t["name"], description=t.get("description", ""),
                            parameters=t.get("parameters", {})))
    return tuple(out)
