"""The OpenAI Responses API adapter (``openai-responses:MODEL``, issue 17).

``POST BASE_URL/responses`` with the history as *input items*: messages, ``function_call`` /
``function_call_output`` items, and the model's own ``reasoning`` items replayed with their
``id`` and ``encrypted_content`` — which is how a reasoning model keeps its reasoning across the
steps of a tool loop without anything kept server-side. Two default options, recorded on
``turn/start`` like any option (C3), make that so: ``store: false`` (the provider keeps
nothing) and ``include: ["reasoning.encrypted_content"]`` (the reasoning comes back to us,
encrypted). Key, base URL and loopback rules are the ``openai:`` adapter's.

Reasoning items become :class:`~dsh.core.messages.Reasoning` parts of kind ``reasoning`` (the
summary as ``text``, the encrypted content as ``data``; kind ``reasoning_text`` when a server
sends the raw reasoning as content instead, as open-weight servers do). Summaries stream to
``on_reasoning`` (:func:`dsh.llm.openai.report_reasoning`), never to ``on_text``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

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
from dsh.core.sanitize import clean_text
from dsh.core.sanitize import join_pairs
from dsh.llm.base import TextCallback
from dsh.llm.base import parse_tool_arguments
from dsh.llm.http.errors import truncate
from dsh.llm.http.model import HTTPModel
from dsh.llm.http.model import make_response
from dsh.llm.openai import MAX_REASONING_CHARS
from dsh.llm.openai import count
from dsh.llm.openai import own_reasoning
from dsh.llm.openai import report_reasoning
from dsh.llm.openai import too_much_reasoning
from dsh.llm.openai import with_reasoning
from dsh.llm.schema import OPTION as OUTPUT_SCHEMA
from dsh.llm.schema import responses_format
from dsh.llm.sse import SSEEvent

PROVIDER = "openai-responses"
_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
#: Stream error codes worth a retry (when no text has been shown yet).
_RETRYABLE_CODES = frozenset({"server_error", "rate_limit_exceeded", "server_is_overloaded",
                              "internal_error"})
#: The events that end a stream.
_TERMINAL = ("response.completed", "response.incomplete")
#: Deltas of an output item's text or arguments.
_DELTAS = ("response.output_text.delta", "response.refusal.delta",
           "response.function_call_arguments.delta")


# -- the request ------------------------------------------------------------------------------


def reasoning_item(r: Reasoning) -> dict[str, Any]:
    """A recorded reasoning part as the input item the API wants back, byte for byte the same
    on every request (and after a resume): its id, its summary (or raw content), its
    encrypted content."""
    item: dict[str, Any] = {"type": "reasoning", "id": r.id}
    if r.kind == "reasoning_text":
        item["summary"] = []
        item["content"] = [{"type": "reasoning_text", "text": r.text}]
    else:
        item["summary"] = [{"type": "summary_text", "text": r.text}] if r.text else []
    if r.data is not None:
        item["encrypted_content"] = r.data
    return item


def input_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The history as input items; an assistant message's own reasoning items come first, then
    its text, then its function calls (the order the API produced them in)."""
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "tool":
            items.append({"type": "function_call_output", "call_id": m.tool_call_id or "",
                          "output": m.content})
        elif m.role == "assistant":
            items.extend(reasoning_item(r)
                         for r in own_reasoning(m, PROVIDER, "reasoning", "reasoning_text"))
            if m.content:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": m.content}]})
            items.extend({"type": "function_call", "call_id": c.id, "name": c.name,
                          "arguments": json.dumps(c.arguments)} for c in m.tool_calls)
        else:  # user, and a system message inside the history (the developer role here)
            role = "developer" if m.role == "system" else m.role
            items.append({"type": "message", "role": role,
                          "content": [{"type": "input_text", "text": m.content}]})
            if m.attachments:  # issue 17: after the text, as the API's examples put them
                items[-1]["content"].extend(attachment_input(a) for a in m.attachments)
    return items


def attachment_input(att: Attachment) -> dict[str, Any]:
    """One recorded attachment as a Responses API content part: ``input_image`` with a
    ``data:`` URL, or ``input_file`` with ``file_data`` for a PDF (issue 17)."""
    from dsh.llm.attachments import PDF
    from dsh.llm.attachments import data_url
    from dsh.llm.attachments import file_name

    if att.media_type == PDF:
        return {"type": "input_file", "filename": file_name(att), "file_data": data_url(att)}
    return {"type": "input_image", "image_url": data_url(att)}


def map_tool(t: ToolSpec) -> dict[str, Any]:
    # strict defaults to true on this API, which demands schemas dsh's tools need not meet
    return {"type": "function", "name": t.name, "description": t.description,
            "parameters": t.parameters or _EMPTY_SCHEMA, "strict": False}


def map_usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    # output_tokens_details.reasoning_tokens is a part of output_tokens: already counted there
    return Usage(input_tokens=count(raw.get("input_tokens")),
                 output_tokens=count(raw.get("output_tokens")),
                 cache_read_tokens=count(cached))


# -- the adapter ------------------------------------------------------------------------------


class ResponsesModel(HTTPModel):
    """``openai-responses:MODEL``: the Responses API at ``base_url + /responses``."""

    provider = PROVIDER
    default_key_env = "OPENAI_API_KEY"
    base_url_env = "OPENAI_BASE_URL"
    default_base_url = "https://api.openai.com/v1"
    path = "/responses"
    key_optional_on_loopback = True
    not_found_hint = " (OpenAI-compatible servers usually end in /v1)"
    #: The request's own fields (``instructions`` carries the system prompt) and server-side
    #: state the ledger would not hold (``previous_response_id``, ``conversation``).
    reserved_options = frozenset({"instructions", "previous_response_id", "conversation"})
    #: ``input_image`` and ``input_file`` (PDF) parts (issue 17).
    attachment_types = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp",
                                  "application/pdf"})

    def auth_headers(self, key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def default_options(self) -> dict[str, Any]:
        """Nothing kept server-side; the reasoning comes back encrypted, to be replayed."""
        return {"store": False, "include": ["reasoning.encrypted_content"]}

    def format_tool(self, tool: ToolSpec) -> dict[str, Any]:
        return map_tool(tool)

    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.wire_model(request)}
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = self.provider_tools(request.tools)  # memoised (D1)
        body["input"] = input_items(request.messages)
        body.update(request.options)  # recorded, protocol keys refused at assembly (C3)
        schema = body.pop(OUTPUT_SCHEMA, None)
        if schema is not None:  # structured output (dsh.schema)
            responses_format(body, schema)
        body["stream"] = stream
        return body

    # -- answers ------------------------------------------------------------------------------

    def malformed(self, what: str) -> ProviderError:
        return ProviderError(f"{self.provider}: malformed response from {self.url}: {what}")

    def parse_json(self, data: Any) -> ModelResponse:
        if not isinstance(data, dict):
            raise self.malformed("not an object")
        if data.get("status") == "failed" or (data.get("error") and not data.get("output")):
            raise self._error(data.get("error"), "response failed")
        return self._response(data, data.get("output"))

    def _response(self, data: dict[str, Any], output: Any) -> ModelResponse:
        if not isinstance(output, list):
            raise self.malformed("no output")
        text: list[str] = []
        refusal: list[str] = []
        calls: list[ToolCall] = []
        parts: list[Reasoning] = []
        size = 0
        for item in output:
            if not isinstance(item, dict):
                raise self.malformed(f"an output item is a {type(item).__name__}")
            kind = item.get("type")
            if kind == "message":
                for c in item.get("content") or ():
                    if isinstance(c, dict) and c.get("type") == "output_text":
                        text.append(self._str(c.get("text"), "output_text.text"))
                    elif isinstance(c, dict) and c.get("type") == "refusal":
                        refusal.append(self._str(c.get("refusal"), "refusal"))
            elif kind == "function_call":
                call_id = item.get("call_id")
                if not isinstance(call_id, str) or not call_id:
                    raise self.malformed("a function_call item without a call_id")
                calls.append(ToolCall(id=call_id, name=self._str(item.get("name"), "name"),
                                      arguments=parse_tool_arguments(item.get("arguments"))))
            elif kind == "reasoning":
                part = self._reasoning(item)
                size += len(part.text) + len(part.data or "")
                if size > MAX_REASONING_CHARS:
                    raise too_much_reasoning(self, MAX_REASONING_CHARS)
                parts.append(part)
        stop = "tool_calls" if calls else "stop"
        if data.get("status") == "incomplete":
            details = data.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            stop = str(reason or "incomplete")
        answer = "".join(text) or "".join(refusal)
        model = data.get("model") if isinstance(data.get("model"), str) else None
        response = make_response(answer, calls, map_usage(data.get("usage")), stop,
                                 model or self.model_name)
        return with_reasoning(response, parts)

    def _reasoning(self, item: dict[str, Any]) -> Reasoning:
        rid = item.get("id")
        if not isinstance(rid, str) or not rid:
            raise self.malformed("a reasoning item without an id (it could not be sent back)")
        data = item.get("encrypted_content")
        if data is not None and not isinstance(data, str):
            raise self.malformed(f"reasoning item {truncate(rid, 60)!r}: encrypted_content is "
                                 "not a string")
        content = [c for c in item.get("content") or () if isinstance(c, dict)
                   and c.get("type") == "reasoning_text"]
        if content:  # raw reasoning (open-weight servers): sent back as content
            raw = "".join(self._str(c.get("text"), "reasoning_text") for c in content)
            return Reasoning(kind="reasoning_text", provider=PROVIDER, id=rid, data=data,
                             text=clean_text(raw)[0])
        summary = [self._str(s.get("text"), "summary_text") for s in item.get("summary") or ()
                   if isinstance(s, dict) and s.get("type") == "summary_text"]
        return Reasoning(kind="reasoning", provider=PROVIDER, id=rid, data=data,
                         text=clean_text("\n\n".join(summary))[0])

    def _str(self, value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise self.malformed(f"{what} is not a string")
        return value

    def _error(self, err: Any, fallback: str) -> ProviderError:
        message, code = self.error_details({"error": err} if err is not None else fallback)
        detail = f" ({code})" if code else ""
        return ProviderError(f"{self.provider}: error from {self.url}{detail}: "
                             f"{truncate(message or fallback)}",
                             retryable=code in _RETRYABLE_CODES)

    def parse_stream(self, events: Iterator[SSEEvent], emit: TextCallback) -> ModelResponse:
        items: dict[int, dict[str, Any]] = {}  # output items by output_index, as they grow
        pieces: dict[int, list[str]] = {}  # text / arguments deltas of items not yet done
        done: set[int] = set()
        safe = StreamText()  # a surrogate pair split across two deltas is printed whole
        shown = StreamText()
        shown_text: tuple[list[str], list[str]] = ([], [])  # the text and refusal deltas
        reasoning = 0
        final: dict[str, Any] | None = None
        for event in events:
            data = self.event_json(event)
            if not isinstance(data, dict):
                raise self.stream_malformed(f"an event is a {type(data).__name__}")
            kind = data.get("type", event.event)
            if kind == "error":
                raise self._error(data, "error event")
            if kind == "response.failed":
                resp = data.get("response")
                raise self._error(resp.get("error") if isinstance(resp, dict) else None,
                                  "response failed")
            if kind in _TERMINAL:
                final = data.get("response")
                if not isinstance(final, dict):
                    raise self.stream_malformed(f"{kind} without a response object")
                break
            if kind in ("response.output_item.added", "response.output_item.done"):
                index, item = self._index(data, kind), data.get("item")
                if not isinstance(item, dict):
                    raise self.stream_malformed(f"{kind} without an item")
                items[index] = item
                if kind.endswith(".done"):
                    done.add(index)
            elif kind in _DELTAS:
                delta = self._delta(data, kind)
                pieces.setdefault(self._index(data, kind), []).append(delta)
                if kind != "response.function_call_arguments.delta":
                    emit(safe.feed(delta))  # the answer's text (a refusal is the answer too)
                    shown_text[kind == "response.refusal.delta"].append(delta)
            elif kind in ("response.reasoning_summary_text.delta",
                          "response.reasoning_text.delta"):
                delta = self._delta(data, kind)
                reasoning += len(delta)
                if reasoning > MAX_REASONING_CHARS:
                    raise too_much_reasoning(self, MAX_REASONING_CHARS)
                out = shown.feed(delta)
                if out:
                    report_reasoning(self, out)
        if final is None:
            raise self.truncated("response.completed")
        emit(safe.flush())
        rest = shown.flush()
        if rest:
            report_reasoning(self, rest)
        output = final.get("output")
        if not isinstance(output, list) or not output:
            # a server that leaves the final output empty: the items as they streamed
            output = [self._finished(items[i], pieces.get(i), i in done) for i in sorted(items)]
        response = self._response(final, output)
        # What the user saw stream is what is recorded: the completed response's text may not
        # differ from its deltas (else the ledger, and the next request, would hold an answer
        # nobody was shown, and the shown one would be in no record).
        streamed = join_pairs("".join(shown_text[0]) or "".join(shown_text[1]))
        if streamed and streamed != join_pairs(response.text):  # "" deltas: nothing was shown
            raise self.stream_malformed(
                "the completed response's text differs from the text it streamed (nothing "
                "was recorded)")
        return response

    @staticmethod
    def _finished(item: dict[str, Any], pieces: list[str] | None, done: bool) -> dict[str, Any]:
        """An item whose ``output_item.done`` never came, completed from its deltas."""
        if done or not pieces:
            return item
        joined = "".join(pieces)
        if item.get("type") == "function_call":
            return {**item, "arguments": joined}
        if item.get("type") == "message":
            return {**item, "content": [{"type": "output_text", "text": joined}]}
        return item

    def _index(self, data: dict[str, Any], kind: str) -> int:
        index = data.get("output_index")
        if type(index) is not int or index < 0:
            raise self.stream_malformed(f"{kind} without an output_index")
        return index

    def _delta(self, data: dict[str, Any], kind: str) -> str:
        delta = data.get("delta")
        if not isinstance(delta, str):
            raise self.stream_malformed(f"{kind} without a string delta")
        return delta

    def stream_malformed(self, what: str) -> ProviderError:
        return ProviderError(f"{self.provider}: malformed stream from {self.url}: {what}")
