"""The Anthropic Messages adapter (``anthropic:MODEL``).

Key from ``ANTHROPIC_API_KEY`` (or ``api_key_env`` / ``api_key``), base URL from the
``base_url`` setting, then ``ANTHROPIC_BASE_URL``, then ``https://api.anthropic.com``; requests
go to ``BASE/v1/messages`` with ``x-api-key`` and ``anthropic-version: 2023-06-01``.

The Messages API wants alternating roles and tool results inside *user* messages, so tool
messages become ``tool_result`` blocks and consecutive messages of one role are merged into
one. ``max_tokens`` is required: 4096 unless the options set it. Input tokens in the usage
include prompt-cache reads and writes, so budgets count every token the request carried.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from dsh.errors import ProviderError
from dsh.llm.base import TextCallback
from dsh.llm.http import HTTPModel
from dsh.llm.http import join_path
from dsh.llm.http import make_response
from dsh.llm.http import parse_tool_arguments
from dsh.llm.http import truncate
from dsh.llm.sse import SSEEvent
from dsh.messages import Attachment
from dsh.messages import Message
from dsh.messages import ModelRequest
from dsh.messages import ModelResponse
from dsh.messages import ToolCall
from dsh.messages import ToolSpec
from dsh.messages import Usage
from dsh.sanitize import StreamText

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
#: Stream error types worth a retry (when no text has been delivered yet).
_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})


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
    if m.attachments:  # before the text, as Anthropic's docs advise
        blocks[:0] = [attachment_block(a) for a in m.attachments]
    blocks.extend(
        {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in m.tool_calls
    )
    return m.role, blocks


def attachment_block(att: Attachment) -> dict[str, Any]:
    """One recorded attachment as a Messages API content block: ``image`` or, for a PDF,
    ``document``, with a base64 source (issue 17)."""
    from dsh.attachments import PDF
    from dsh.attachments import base64_of

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


def map_tool(t: ToolSpec) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": t.name, "input_schema": t.parameters or _EMPTY_SCHEMA}
    if t.description:
        tool["description"] = t.description
    return tool


def _input_tokens(u: dict[str, Any]) -> int:
    return sum(
        int(u.get(k) or 0)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )


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
        body["stream"] = stream
        return body

    def default_options(self) -> dict[str, Any]:
        return {"max_tokens": DEFAULT_MAX_TOKENS}

    def parse_json(self, data: Any) -> ModelResponse:
        if not isinstance(data, dict) or not isinstance(data.get("content"), list):
            if isinstance(data, dict) and data.get("type") == "error":
                raise self._stream_error(data)
            raise ProviderError(f"anthropic: malformed response from {self.url}: no content")
        text: list[str] = []
        calls: list[ToolCall] = []
        for block in data["content"]:
            kind = block.get("type")
            if kind == "text":
                text.append(str(block.get("text") or ""))
            elif kind == "tool_use":
                calls.append(
                    ToolCall(
                        id=block.get("id") or "",
                        name=str(block.get("name") or ""),
                        arguments=parse_tool_arguments(block.get("input")),
                    )
                )
        u = data.get("usage") or {}
        usage = Usage(input_tokens=_input_tokens(u), output_tokens=int(u.get("output_tokens") or 0))
        return make_response(
            "".join(text),
            calls,
            usage,
            data.get("stop_reason"),
            data.get("model") or self.model_name,
        )

    def parse_stream(self, events: Iterator[SSEEvent], emit: TextCallback) -> ModelResponse:
        blocks: dict[int, dict[str, Any]] = {}
        input_tokens = output_tokens = 0
        stop_reason: str | None = None
        model: str | None = None
        done = False
        safe = StreamText()  # a surrogate pair split across two deltas is printed whole
        for event in events:
            payload = self.event_json(event)
            if not isinstance(payload, dict):
                raise ProviderError(f"anthropic: malformed stream from {self.url}: {payload!r}")
            kind = payload.get("type") or event.event
            if kind == "message_start":
                msg = payload.get("message") or {}
                model = msg.get("model") or model
                usage = msg.get("usage") or {}
                input_tokens = _input_tokens(usage)
                output_tokens = int(usage.get("output_tokens") or 0)
            elif kind == "content_block_start":
                block = dict(payload.get("content_block") or {})
                block["parts"] = []
                blocks[int(payload.get("index", len(blocks)))] = block
            elif kind == "content_block_delta":
                index = int(payload.get("index", 0))
                block = blocks.setdefault(index, {"type": "text", "text": "", "parts": []})
                delta = payload.get("delta") or {}
                if delta.get("type") == "text_delta":
                    piece = str(delta.get("text") or "")
                    block["text"] = str(block.get("text") or "") + piece
                    emit(safe.feed(piece))
                elif delta.get("type") == "input_json_delta":
                    block["parts"].append(str(delta.get("partial_json") or ""))
                # thinking, signature and citation deltas are not part of the answer text
            elif kind == "message_delta":
                stop_reason = (payload.get("delta") or {}).get("stop_reason") or stop_reason
                usage = payload.get("usage") or {}
                if usage.get("output_tokens") is not None:
                    output_tokens = int(usage["output_tokens"])
                if usage.get("input_tokens") is not None:
                    input_tokens = _input_tokens(usage)
            elif kind == "message_stop":
                done = True
                break
            elif kind == "error":
                raise self._stream_error(payload)
            # ping, content_block_stop and event types added later need no action
        if not done:
            raise self.truncated("message_stop")
        emit(safe.flush())
        text: list[str] = []
        calls: list[ToolCall] = []
        for _, block in sorted(blocks.items()):
            if block.get("type") == "text":
                text.append(str(block.get("text") or ""))
            elif block.get("type") == "tool_use":
                raw = "".join(block["parts"])
                calls.append(
                    ToolCall(
                        id=str(block.get("id") or ""),
                        name=str(block.get("name") or ""),
                        arguments=parse_tool_arguments(raw if raw else block.get("input")),
                    )
                )
        usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens)
        return make_response("".join(text), calls, usage, stop_reason, model or self.model_name)

    def _stream_error(self, payload: dict[str, Any]) -> ProviderError:
        message, kind = self.error_details(payload)
        return ProviderError(
            f"anthropic: error in stream from {self.url} ({kind or 'error'}): {truncate(message)}",
            retryable=kind in _RETRYABLE_ERRORS,
        )
