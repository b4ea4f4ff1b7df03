"""An MCP ``CallToolResult`` as a dsh tool output (docs/mcp.md, "Results").

- text blocks: their text; blocks are joined with a newline;
- image / audio blocks: ``[image: MIME, N bytes]`` / ``[audio: MIME, N bytes]``;
- embedded resources: their text, or ``[resource: URI]`` for a binary one; resource links:
  ``[resource: URI]``;
- ``structuredContent``: appended as JSON on a line of its own, unless the text already says
  it: the text is that JSON, or the structured content only wraps the text in an object of
  one key (the SDK's ``{"result": …}``, the official filesystem server's ``{"content": …}``)
  — the text itself or the JSON it holds. The model gets it once, not twice;
- ``isError``: the same text, as an error outcome (:class:`dsh.core.errors.ToolError`).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from dsh.core.errors import ToolError


def to_output(result: Any) -> str:
    parts = [_block(b) for b in result.content or ()]
    text = "\n".join(parts)
    structured = getattr(result, "structured_content", None)
    if structured is not None and not _same_json(text, structured):
        dumped = json.dumps(structured, ensure_ascii=False)
        text = f"{text}\n{dumped}" if text else dumped
    if result.is_error:
        raise ToolError(text or "the tool reported an error (no content)")
    return text


def _block(block: Any) -> str:
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_decoded_size(block.data)} bytes]"
    if kind == "resource":
        res = block.resource
        text = getattr(res, "text", None)
        return str(text) if text is not None else f"[resource: {res.uri}]"
    if kind == "resource_link":
        return f"[resource: {block.uri}]"
    return f"[{kind or 'unknown'} content]"


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)


def _same_json(text: str, value: Any) -> bool:
    """Whether ``value`` says nothing the text does not: the text is that JSON, or ``value``
    is an object of one key wrapping the text or the JSON it holds (the SDK's
    ``{"result": …}`` for a plain return value, the filesystem server's ``{"content": …}``).
    Only exact equality counts: a wrapper that differs from the text by one character is
    sent."""
    try:
        parsed: Any = json.loads(text)
        parses = True
    except (ValueError, RecursionError):
        parsed, parses = None, False
    if parses and _equal(parsed, value):
        return True
    if isinstance(value, dict) and len(value) == 1:
        [inner] = value.values()
        if inner == text or (parses and _equal(parsed, inner)):
            return True
    return False


def _equal(a: Any, b: Any) -> bool:
    # JSON equality without Python's 1 == True == 1.0 (a bool is not a number in JSON)
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) and isinstance(a, str) == isinstance(b, str)


def cap(text: str, limit: int) -> str:
    """``text`` within ``limit`` bytes of UTF-8 (``max_output``): when it is longer, its first
    and last ``limit // 2`` bytes (cut at character boundaries) around one marker line that
    says how much was cut, so the ledger and every later request hold a bounded output."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    half = limit // 2
    head = data[:half].decode("utf-8", "ignore")
    tail = data[len(data) - half:].decode("utf-8", "ignore")
    hidden = len(data) - len(head.encode("utf-8", "surrogatepass")) - len(
        tail.encode("utf-8", "surrogatepass"))
    return (f"{head}\n[… {hidden} bytes cut: the output was {len(data)} bytes, over "
            f"max_output = {limit} …]\n{tail}")
