"""The Anthropic Messages adapter (``anthropic:MODEL``).

Key from ``ANTHROPIC_API_KEY`` (or ``api_key_env`` / ``api_key``), base URL from the
``base_url`` setting, then ``ANTHROPIC_BASE_URL``, then ``https://api.anthropic.com``; requests
go to ``BASE/v1/messages`` with ``x-api-key`` and ``anthropic-version: 2023-06-01``.

The Messages API wants alternating roles and tool results inside *user* messages, so tool
messages become ``tool_result`` blocks and consecutive messages of one role are merged into
one. ``max_tokens`` is required: 4096 unless the options set it. Input tokens in the usage
include prompt-cache reads and writes, so budgets count every token the request carried; the
reads and writes are also counted apart (``cache_read_tokens``, ``cache_write_tokens``) so the
cost budget prices them at their own rates.

**Extended thinking** (issue 17) is the API's own option, recorded with the others:
``options.thinking = {type = "enabled", budget_tokens = N}``, or the shorthand
``thinking = N`` (sent as that table). ``thinking`` and ``redacted_thinking`` blocks are parsed
into :class:`~dsh.core.messages.Reasoning` parts (provider ``anthropic``), in order, and replayed
exactly — first in the assistant message, thinking text, signature and redacted data byte for
byte — on every later request: the API refuses a tool result whose assistant turn lost its
thinking blocks. Parts of another provider family are not sent.

**Prompt caching** (issue 17) follows :func:`place_breakpoints`: with ``cache = "auto"`` (the
default, an option recorded like the others; ``cache = "off"`` in the options or the model's
settings turns it off) a ``cache_control`` breakpoint ends the stable prefix (on the system
prompt, else on the last tool) and two move with the conversation (the last two user-role
messages: the end of this request and of the previous one), three of the four the API allows.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import attrs

from dsh.core.errors import ConfigError
from dsh.core.errors import ProviderError
from dsh.core.messages import Attachment
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import Reasoning
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.core.sanitize import StreamText
from dsh.core.sanitize import join_pairs
from dsh.llm.base import TextCallback
from dsh.llm.base import parse_tool_arguments
from dsh.llm.http.errors import truncate
from dsh.llm.http.model import HTTPModel
from dsh.llm.http.model import make_response
from dsh.llm.http.settings import join_path
from dsh.llm.schema import OPTION as OUTPUT_SCHEMA
from dsh.llm.schema import answer_from_tool
from dsh.llm.schema import output_tool
from dsh.llm.sse import SSEEvent

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
#: Stream error types worth a retry (when no text has been delivered yet).
_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})
#: The prompt-cache modes of the ``cache`` option (and the model setting of that name).
CACHE_MODES = ("auto", "off")
#: At most this many ``cache_control`` breakpoints in one request (the API's limit).
MAX_BREAKPOINTS = 4
#: The reasoning parts this adapter writes and replays
#: (:attr:`dsh.core.messages.Reasoning.provider`).
REASONING_PROVIDER = "anthropic"
#: More characters of thinking, signatures and redacted data in one response is an error (a
#: runaway or hostile server): nothing is recorded.
MAX_REASONING_CHARS = 8_000_000


def reasoning_block(r: Reasoning) -> dict[str, Any] | None:
    """A recorded reasoning part as the content block it came from (None: not ours)."""
    if r.provider != REASONING_PROVIDER:
        return None
    if r.kind == "thinking":
        block: dict[str, Any] = {"type": "thinking", "thinking": r.text}
        if r.signature is not None:
            block["signature"] = r.signature
        return block
    if r.kind == "redacted_thinking":
        return {"type": "redacted_thinking", "data": r.data or ""}
    return None


def _blocks(m: Message) -> tuple[str, list[dict[str, Any]]]:
    """One message as (API role, content blocks)."""
    if m.role == "tool":
        block: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": m.tool_call_id or "",
            "content": m.content,
            "is_error": m.is_error,
        }
        return "user", [block]
    if m.role not in ("user", "assistant"):
        raise ProviderError(f"anthropic: cannot send a message with role {m.role!r}")
    # the API rejects empty text blocks
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    if m.reasoning:  # thinking first, exactly as received (only this provider family's)
        thinking = [b for b in map(reasoning_block, m.reasoning) if b is not None]
        blocks[:0] = thinking
    if m.attachments:  # before the text, as Anthropic's docs advise
        blocks[:0] = [attachment_block(a) for a in m.attachments]
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls
    )
    return m.role, blocks


def attachment_block(att: Attachment) -> dict[str, Any]:
    """One recorded attachment as a Messages API content block: ``image`` or, for a PDF,
    ``document``, with a base64 source (issue 17)."""
    from dsh.llm.attachments import PDF
    from dsh.llm.attachments import base64_of

    return {"type": "document" if att.media_type == PDF else "image",
            "source": {"type": "base64", "media_type": att.media_type,
                       "data": base64_of(att)}}


def map_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        role, blocks = _blocks(m)
        if not blocks:
            continue  # an empty message carries nothing and would be rejected
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)  # roles must alternate: merge neighbours
        else:
            out.append({"role": role, "content": blocks})
    return out


def _reasoning_part(block: dict[str, Any]) -> Reasoning:
    """A ``thinking`` or ``redacted_thinking`` block as a recorded part (strings kept as the
    API sent them: they are replayed byte for byte)."""
    if block.get("type") == "redacted_thinking":
        return Reasoning(kind="redacted_thinking", provider=REASONING_PROVIDER,
                         data=str(block.get("data") or ""))
    signature = block.get("signature")
    return Reasoning(kind="thinking", provider=REASONING_PROVIDER,
                     text=str(block.get("thinking") or ""),
                     signature=None if signature is None else str(signature))


def map_tool(t: ToolSpec) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": t.name, "input_schema": t.parameters or _EMPTY_SCHEMA}
    if t.description:
        tool["description"] = t.description
    return tool


def _count(value: Any) -> int:
    """A token count from the server: a non-negative integer, else 0 — a negative count would
    give budget back (token and cost limits are spent from these)."""
    return value if type(value) is int and value >= 0 else 0


def _input_tokens(u: dict[str, Any]) -> int:
    return sum(
        _count(u.get(k))
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )


def _usage(u: dict[str, Any], output_tokens: int) -> Usage:
    """Anthropic's usage: ``input_tokens`` counts only what follows the last cache
    breakpoint, so every input token is ``input_tokens + cache_creation_input_tokens +
    cache_read_input_tokens`` (the published accounting); reads and writes are kept apart."""
    return Usage(input_tokens=_input_tokens(u), output_tokens=_count(output_tokens),
                 cache_read_tokens=_count(u.get("cache_read_input_tokens")),
                 cache_write_tokens=_count(u.get("cache_creation_input_tokens")))


_EPHEMERAL = {"type": "ephemeral"}


def place_breakpoints(body: dict[str, Any]) -> int:
    """Put ``cache_control`` breakpoints into ``body`` (a request about to be sent), by the
    documented policy; returns how many were placed (at most :data:`MAX_BREAKPOINTS`).

    1. The **stable prefix** — tools, then the system prompt, the order in which the API
       caches — ends with one breakpoint: on the system prompt (made a one-block list), else
       on the last tool. Both are recorded once per change, so this prefix is byte-identical
       from step to step.
    2. The **conversation** gets two moving breakpoints: on the last block of the last
       user-role message (where this request ends: the next one reads it from the cache) and
       of the user-role message before it (where the previous request ended: this one reads
       it). Nothing per step goes before them — history is appended, never rewritten.

    Blocks are copied before they are marked: the memoised tool table stays as it is.
    """
    placed = 0
    if isinstance(body.get("system"), str) and body["system"]:
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": _EPHEMERAL}]
        placed += 1
    elif body.get("tools"):
        tools = list(body["tools"])
        tools[-1] = {**tools[-1], "cache_control": _EPHEMERAL}
        body["tools"] = tools
        placed += 1
    moving = 0
    for message in reversed(body.get("messages") or []):
        if moving == 2 or placed == MAX_BREAKPOINTS:
            break
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list) or not content:
            continue  # assistant messages may end in thinking blocks, which take none
        content[-1] = {**content[-1], "cache_control": _EPHEMERAL}
        moving += 1
        placed += 1
    return placed


def thinking_option(value: Any) -> Any:
    """The ``thinking`` option as the API takes it: an integer is the shorthand for
    ``{"type": "enabled", "budget_tokens": N}``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return {"type": "enabled", "budget_tokens": value}
    return value


class AnthropicModel(HTTPModel):
    """``anthropic:MODEL``: the Messages API."""

    provider = "anthropic"
    default_key_env = "ANTHROPIC_API_KEY"
    base_url_env = "ANTHROPIC_BASE_URL"
    default_base_url = "https://api.anthropic.com"
    path = "/v1/messages"
    not_found_hint = " (it should not include /v1/messages)"
    #: ``image`` and ``document`` (PDF) blocks (issue 17).
    attachment_types = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp",
                                  "application/pdf"})

    def endpoint(self) -> str:
        # tolerate a base_url that already ends in /v1, a common slip
        if urlsplit(self.base_url).path.endswith("/v1"):
            return join_path(self.base_url, "/messages")
        return join_path(self.base_url, self.path)

    def auth_headers(self, key: str | None) -> dict[str, str]:
        headers = {"anthropic-version": API_VERSION}
        if key:
            headers["x-api-key"] = key
        return headers

    def format_tool(self, tool: ToolSpec) -> dict[str, Any]:
        return map_tool(tool)

    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.wire_model(request),
            "max_tokens": DEFAULT_MAX_TOKENS,  # required; recorded as a default option
            "messages": map_messages(request.messages),
        }
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = self.provider_tools(request.tools)  # memoised (D1)
        # The options are the recorded ones, protocol keys excluded at assembly (C3).
        body.update(request.options)
        cache = body.pop("cache", "off")  # dsh's option, not the API's (absent: none placed)
        if cache not in CACHE_MODES:
            raise ConfigError(f"anthropic: option cache = {cache!r}: expected one of "
                              f"{', '.join(repr(m) for m in CACHE_MODES)}")
        if "thinking" in body:
            body["thinking"] = thinking = thinking_option(body["thinking"])
            budget = thinking.get("budget_tokens") if isinstance(thinking, dict) else None
            limit = body.get("max_tokens")
            if isinstance(budget, int) and isinstance(limit, int) and budget >= limit:
                raise ConfigError(
                    f"anthropic: option thinking.budget_tokens ({budget}) must be less than "
                    f"max_tokens ({limit}): raise max_tokens in the options")
        schema = body.pop(OUTPUT_SCHEMA, None)
        if schema is not None:  # structured output (dsh.schema): a tool the model must call
            thinking = body.get("thinking")
            output_tool(body, schema, forced=not (
                isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")))
        if cache == "auto":
            place_breakpoints(body)
        body["stream"] = stream
        return body

    def default_options(self) -> dict[str, Any]:
        cache = self.settings.get("cache", "auto")
        if cache not in CACHE_MODES:
            raise ConfigError(f"models: anthropic:{self.model_name}: cache = {cache!r}: "
                              f"expected one of {', '.join(repr(m) for m in CACHE_MODES)}")
        return {"max_tokens": DEFAULT_MAX_TOKENS, "cache": cache}

    def _complete(self, request: ModelRequest, on_text: TextCallback | None) -> ModelResponse:
        response = super()._complete(request, on_text)
        if OUTPUT_SCHEMA in request.options:
            response = answer_from_tool(response)  # the output tool's input is the answer
        return response

    def parse_json(self, data: Any) -> ModelResponse:
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            if isinstance(data, dict) and data.get("type") == "error":
                raise self._stream_error(data)
            raise ProviderError(f"anthropic: malformed response from {self.url}: no content")
        text: list[str] = []
        calls: list[ToolCall] = []
        reasoning: list[Reasoning] = []
        for block in data["content"]:
            kind = block.get("type")
            if kind == "text":
                text.append(str(block.get("text") or ""))
            elif kind in ("thinking", "redacted_thinking"):
                reasoning.append(_reasoning_part(block))
            elif kind == "tool_use":
                calls.append(
                    ToolCall(
                        id=block.get("id") or "",
                        name=str(block.get("name") or ""),
                        arguments=parse_tool_arguments(block.get("input")),
                    )
                )
        self._bounded(sum(len(r.text) + len(r.signature or "") + len(r.data or "")
                          for r in reasoning))
        u = data.get("usage") or {}
        usage = _usage(u, int(u.get("output_tokens") or 0))
        response = make_response(
            "".join(text),
            calls,
            usage,
            data.get("stop_reason"),
            data.get("model") or self.model_name,
        )
        return attrs.evolve(response, reasoning=reasoning) if reasoning else response

    def parse_stream(self, events: Iterator[SSEEvent], emit: TextCallback) -> ModelResponse:
        blocks: dict[int, dict[str, Any]] = {}
        output_tokens = reasoning_size = 0
        start_usage: dict[str, Any] = {}
        stop_reason: str | None = None
        model: str | None = None
        done = False
        safe = StreamText()  # a surrogate pair split across two deltas is printed whole
        safe_reasoning = StreamText()
        shown: list[str] = []  # the text deltas, as the user saw them stream
        for event in events:
            payload = self.event_json(event)
            if not isinstance(payload, dict):
                raise ProviderError(f"anthropic: malformed stream from {self.url}: {payload!r}")
            kind = payload.get("type") or event.event
            if kind == "message_start":
                msg = payload.get("message") or {}
                model = msg.get("model") or model
                usage = msg.get("usage") or {}
                start_usage = dict(usage)
                output_tokens = int(usage.get("output_tokens") or 0)
            elif kind == "content_block_start":
                block = dict(payload.get("content_block") or {})
                block["parts"] = []
                if block.get("type") == "redacted_thinking":
                    reasoning_size = self._bounded(reasoning_size + len(str(block.get("data"))))
                elif block.get("type") == "thinking" and block.get("thinking"):
                    block["parts"].append(str(block["thinking"]))
                blocks[int(payload.get("index", len(blocks)))] = block
            elif kind == "content_block_delta":
                index = int(payload.get("index", 0))
                block = blocks.setdefault(index, {"type": "text", "text": "", "parts": []})
                delta = payload.get("delta") or {}
                if delta.get("type") == "text_delta":
                    piece = str(delta.get("text") or "")
                    block["text"] = str(block.get("text") or "") + piece
                    shown.append(piece)
                    emit(safe.feed(piece))
                elif delta.get("type") == "input_json_delta":
                    block["parts"].append(str(delta.get("partial_json") or ""))
                elif delta.get("type") == "thinking_delta":  # reasoning, never answer text
                    piece = str(delta.get("thinking") or "")
                    reasoning_size = self._bounded(reasoning_size + len(piece))
                    block["parts"].append(piece)
                    self.emit_reasoning(safe_reasoning.feed(piece))
                elif delta.get("type") == "signature_delta":
                    piece = str(delta.get("signature") or "")
                    reasoning_size = self._bounded(reasoning_size + len(piece))
                    block["signature"] = str(block.get("signature") or "") + piece
                # citation deltas and delta types added later are not part of the answer
            elif kind == "message_delta":
                stop_reason = (payload.get("delta") or {}).get("stop_reason") or stop_reason
                usage = payload.get("usage") or {}
                if usage.get("output_tokens") is not None:
                    output_tokens = int(usage["output_tokens"])
                for key in ("input_tokens", "cache_creation_input_tokens",
                            "cache_read_input_tokens"):
                    if usage.get(key) is not None:  # cumulative: the final counts
                        start_usage[key] = usage[key]
            elif kind == "message_stop":
                done = True
                break
            elif kind == "error":
                raise self._stream_error(payload)
            # ping, content_block_stop and event types added later need no action
        if not done:
            raise self.truncated("message_stop")
        emit(safe.flush())
        self.emit_reasoning(safe_reasoning.flush())
        text: list[str] = []
        calls: list[ToolCall] = []
        reasoning: list[Reasoning] = []
        for _, block in sorted(blocks.items()):
            if block.get("type") == "text":
                text.append(str(block.get("text") or ""))
            elif block.get("type") == "thinking":
                reasoning.append(_reasoning_part({**block, "thinking": "".join(block["parts"])}))
            elif block.get("type") == "redacted_thinking":
                reasoning.append(_reasoning_part(block))
            elif block.get("type") == "tool_use":
                raw = "".join(block["parts"])
                calls.append(
                    ToolCall(
                        id=str(block.get("id") or ""),
                        name=str(block.get("name") or ""),
                        arguments=parse_tool_arguments(raw if raw else block.get("input")),
                    )
                )
        if join_pairs("".join(text)) != join_pairs("".join(shown)):
            # Text in a content_block_start, or blocks streamed out of index order: what would
            # be recorded (and sent back next) is not what the user saw stream.
            raise ProviderError(f"anthropic: malformed stream from {self.url}: the message's "
                                "text differs from the text it streamed (nothing was recorded)")
        usage = _usage(start_usage, output_tokens)
        response = make_response("".join(text), calls, usage, stop_reason,
                                 model or self.model_name)
        return attrs.evolve(response, reasoning=reasoning) if reasoning else response

    def _bounded(self, size: int) -> int:
        """``size`` (characters of reasoning so far), or the error past the bound."""
        if size > MAX_REASONING_CHARS:
            raise ProviderError(
                f"anthropic: malformed response from {self.url}: its thinking exceeds "
                f"{MAX_REASONING_CHARS} characters (a runaway or hostile server); nothing was "
                "recorded")
        return size

    def _stream_error(self, payload: dict[str, Any]) -> ProviderError:
        message, kind = self.error_details(payload)
        return ProviderError(
            f"anthropic: error in stream from {self.url} ({kind or 'error'}): {truncate(message)}",
            retryable=kind in _RETRYABLE_ERRORS,
        )
