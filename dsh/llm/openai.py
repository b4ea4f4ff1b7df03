"""The OpenAI-compatible chat completions adapter (``openai:MODEL``).

One wire protocol covers OpenAI itself and the servers that copy it: Ollama, llama.cpp server,
vLLM, LM Studio, OpenRouter. The key comes from ``OPENAI_API_KEY`` (or ``api_key_env`` /
``api_key``); the base URL from the ``base_url`` setting, then ``OPENAI_BASE_URL``, then
``https://api.openai.com/v1``. On a loopback base URL a missing key is allowed, since local
servers need none. Text tool-call rescue is not done here: the core does it after we return.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

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
from dsh.core.sanitize import clean_text
from dsh.core.sanitize import join_pairs
from dsh.llm.base import TextCallback
from dsh.llm.base import parse_tool_arguments
from dsh.llm.http.errors import truncate
from dsh.llm.http.model import HTTPModel
from dsh.llm.http.model import make_response
from dsh.llm.schema import DIALECTS
from dsh.llm.schema import OPTION as OUTPUT_SCHEMA
from dsh.llm.schema import response_format
from dsh.llm.sse import SSEEvent

_EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


def _call_id() -> str:
    # Some local servers omit ids; the ledger and the tool messages need one, unique per session.
    return f"call_{uuid.uuid4().hex[:24]}"


def map_message(m: Message, replay: bool = False) -> dict[str, Any]:
    """One message on the wire; ``replay``: with its recorded ``reasoning_content``."""
    if replay and m.role == "assistant":
        own = own_reasoning(m, "openai", "reasoning_content")
        if own:
            return {**map_message(m), "reasoning_content": "".join(r.text for r in own)}
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
    if m.role == "assistant" and m.tool_calls:
        return {
            "role": "assistant",
            "content": m.content or None,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in m.tool_calls
            ],
        }
    if m.attachments:
        return {"role": m.role, "content": content_parts(m)}
    return {"role": m.role, "content": m.content}


def attachment_part(att: Attachment) -> dict[str, Any]:
    """One recorded attachment as a chat completions content part: an image as
    ``image_url`` with a ``data:`` URL, a PDF as ``file`` with ``file_data`` (issue 17)."""
    from dsh.llm.attachments import PDF
    from dsh.llm.attachments import data_url
    from dsh.llm.attachments import file_name

    if att.media_type == PDF:
        return {"type": "file", "file": {"filename": file_name(att),
                                         "file_data": data_url(att)}}
    return {"type": "image_url", "image_url": {"url": data_url(att)}}


def content_parts(m: Message) -> list[dict[str, Any]]:
    """A user message with attachments: its text part, then one part per attachment."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    parts.extend(attachment_part(a) for a in m.attachments)
    return parts


def map_tool(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters or _EMPTY_SCHEMA,
        },
    }


def map_usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("prompt_tokens_details")
    # OpenAI: prompt_tokens_details.cached_tokens; DeepSeek: prompt_cache_hit_tokens. Both are
    # a part of prompt_tokens, as Usage.cache_read_tokens is of input_tokens.
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None:
        cached = raw.get("prompt_cache_hit_tokens")
    return Usage(
        input_tokens=count(raw.get("prompt_tokens")),  # never negative: budgets spend these
        output_tokens=count(raw.get("completion_tokens")),
        cache_read_tokens=count(cached),
    )


def count(value: Any) -> int:
    """A token count from a server: a non-negative integer, else 0 (never raises)."""
    return value if type(value) is int and value >= 0 else 0


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, as some servers answer
        parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(str(p.get("text", "")) for p in parts)
    return ""


class OpenAIModel(HTTPModel):
    """``openai:MODEL``: the chat completions protocol at ``base_url + /chat/completions``."""

    provider = "openai"
    default_key_env = "OPENAI_API_KEY"
    base_url_env = "OPENAI_BASE_URL"
    default_base_url = "https://api.openai.com/v1"
    path = "/chat/completions"
    key_optional_on_loopback = True
    not_found_hint = " (OpenAI-compatible servers usually end in /v1)"
    #: Protocol fields of chat completions that options must not set: ``stream_options``
    #: follows ``stream``; ``functions`` is the legacy name of ``tools``.
    reserved_options = frozenset({"stream_options", "functions"})
    #: Images as ``image_url`` parts, PDFs as ``file`` parts (issue 17); a server that takes
    #: neither is configured ``attachments = false`` (or a list of the types it takes).
    attachment_types = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp",
                                  "application/pdf"})

    def probe_context_window(self) -> int | None:
        """The context size a local server reports (llama.cpp's ``GET /props``), asked once,
        only on a loopback ``base_url`` and only after a context-length error that stated no
        size (dsh.run.compaction.learn_window): no request is ever added to the normal path."""
        known = getattr(self, "_reported_window", False)
        if known is not False:
            return known
        self._reported_window: int | None = None
        from dsh.llm.http.client import get_client
        from dsh.llm.http.settings import is_loopback

        if not is_loopback(self.base_url):
            return None
        root = self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url
        client = get_client(self.settings)
        try:
            resp = client.get(root + "/props", timeout=2.0)
            data = resp.json() if resp.status_code == 200 else {}
        except Exception:  # noqa: BLE001 - a server that does not say is the common case
            data = {}
        finally:
            from dsh.host.runcontext import current_or_none

            if current_or_none() is None:
                client.close()
        if isinstance(data, dict):
            gen = data.get("default_generation_settings")
            n = gen.get("n_ctx") if isinstance(gen, dict) else data.get("n_ctx")
            if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                self._reported_window = n
        return self._reported_window

    def auth_headers(self, key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}

    def default_options(self) -> dict[str, Any]:
        """``[models.ID] reasoning_replay`` becomes a recorded option (issue 17, C3)."""
        if self.settings.get(REASONING_REPLAY) is None:
            return {}
        settings = self.settings
        return {REASONING_REPLAY: reasoning_replay(settings, f"{self.provider}:{self.name}")}

    def schema_dialect(self) -> str:
        """How ``response_format`` carries an output schema: ``[models.ID] schema_dialect``,
        else what this server was found to take (see :meth:`_complete`), else OpenAI's."""
        learned = getattr(self, "_learned_dialect", None)
        dialect = str(self.settings.get("schema_dialect") or learned or "json_schema")
        if dialect not in DIALECTS:
            raise ConfigError(f"model {self.name!r}: schema_dialect {dialect!r} is not one of "
                              + ", ".join(DIALECTS))
        return dialect

    def status_error(self, status: int, raw: bytes, headers: Any) -> ProviderError:
        err = super().status_error(status, raw, headers)
        if "response_format" in str(err) and "json_schema" in str(err):
            err.retryable = False  # a server that does not take this form: asking again is moot
        return err

    def _complete(self, request: ModelRequest, on_text: TextCallback | None) -> ModelResponse:
        try:
            response = super()._complete(request, on_text)
        except ProviderError as exc:
            # llama-cpp-python's server answers OpenAI's json_schema response_format with an
            # error naming the literal, and takes {"type": "json_object", "schema": …}: learn
            # that once (unless the dialect is configured) and send the request again. Only
            # for that refusal (an HTTP error naming both, which status_error does not retry),
            # never once this server took json_schema, and the resend is a request of the
            # run's budget like any retry (D8): no other error can add a request.
            text = str(exc)
            if (OUTPUT_SCHEMA not in request.options or self.settings.get("schema_dialect")
                    or self.schema_dialect() != "json_schema" or exc.status is None
                    or exc.retryable or "json_schema" not in text
                    or "response_format" not in text
                    or getattr(self, "_json_schema_taken", False)):
                raise
            from dsh.core.errors import BudgetExceeded
            from dsh.host.runcontext import current_or_none

            ctx = current_or_none()
            refused = ctx.budget.reserve(requests=1) if ctx is not None else None
            if refused:
                raise BudgetExceeded(refused) from None
            self._learned_dialect = "json_object"
            return super()._complete(request, on_text)
        if OUTPUT_SCHEMA in request.options and self.schema_dialect() == "json_schema":
            self._json_schema_taken = True
        return response

    def format_tool(self, tool: ToolSpec) -> dict[str, Any]:
        return map_tool(tool)

    def build_body(self, request: ModelRequest, stream: bool) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        # Recorded reasoning goes back as the recorded policy says (issue 17, C3).
        policy = reasoning_replay(request.options, f"{self.provider}:{self.name}")
        replay = replayed_messages(request.messages, policy)
        messages.extend(map_message(m, i in replay) for i, m in enumerate(request.messages))
        body: dict[str, Any] = {"model": self.wire_model(request), "messages": messages}
        if request.tools:
            body["tools"] = self.provider_tools(request.tools)  # memoised (D1)
        # The options are the recorded ones, protocol keys excluded at assembly (C3).
        body.update(request.options)
        body.pop(REASONING_REPLAY, None)  # dsh's own option: what to send, not a field
        schema = body.pop(OUTPUT_SCHEMA, None)
        if schema is not None:  # structured output (dsh.schema)
            body["response_format"] = response_format(schema, self.schema_dialect())
        if stream:
            # usage arrives in a last chunk with empty choices
            body["stream_options"] = {"include_usage": True}
        body["stream"] = stream
        return body

    def parse_json(self, data: Any) -> ModelResponse:
        if isinstance(data, dict) and data.get("error"):
            raise self._stream_error(data["error"])
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise ProviderError(f"openai: malformed response from {self.url}: no choices")
        choice = choices[0]
        msg = choice.get("message") or {}
        calls: list[ToolCall] = []
        for raw in msg.get("tool_calls") or []:
            fn = raw.get("function") or {}
            calls.append(
                ToolCall(
                    id=raw.get("id") or _call_id(),
                    name=str(fn.get("name") or ""),
                    arguments=parse_tool_arguments(fn.get("arguments")),
                )
            )
        thought = ReasoningText(self)
        value = _reasoning_field(msg)
        if value is not None:
            thought.add(value, show=False)
        return with_reasoning(make_response(
            _text_of(msg.get("content")),
            calls,
            map_usage(data.get("usage")),
            choice.get("finish_reason"),
            data.get("model") or self.model_name,
        ), self._reasoning_parts(thought))

    def _reasoning_parts(self, thought: ReasoningText) -> list[Reasoning]:
        if not thought.seen:
            return []
        return [Reasoning(kind="reasoning_content", provider="openai", text=thought.text())]

    def parse_stream(self, events: Iterator[SSEEvent], emit: TextCallback) -> ModelResponse:
        text: list[str] = []
        slots: dict[int, dict[str, Any]] = {}  # tool calls by their delta index
        usage = Usage()
        finish: str | None = None
        model: str | None = None
        done = False
        safe = StreamText()  # a surrogate pair split across two deltas is printed whole
        thought = ReasoningText(self)  # reasoning_content deltas: recorded, never on_text
        for event in events:
            if event.data.strip() == "[DONE]":
                done = True
                break
            chunk = self.event_json(event)
            if not isinstance(chunk, dict):
                raise ProviderError(f"openai: malformed stream from {self.url}: {chunk!r}")
            if chunk.get("error"):
                raise self._stream_error(chunk["error"])
            model = chunk.get("model") or model
            if chunk.get("usage"):
                usage = map_usage(chunk["usage"])
            for choice in chunk.get("choices") or ():
                if choice.get("index", 0) != 0:
                    continue  # n > 1 is not supported: the first choice is the answer
                delta = choice.get("delta") or {}
                reasoning = _reasoning_field(delta)
                if reasoning is not None:
                    thought.add(reasoning)
                content = delta.get("content")
                if isinstance(content, str) and content:
                    text.append(content)
                    emit(safe.feed(content))
                for tc in delta.get("tool_calls") or ():
                    self._merge_call(slots, tc)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if not done and finish is None:
            raise self.truncated("[DONE]")
        emit(safe.flush())
        calls = [
            ToolCall(
                id=s["id"] or _call_id(),
                name=s["name"],
                arguments=parse_tool_arguments("".join(s["args"])),
            )
            for _, s in sorted(slots.items())
        ]
        response = make_response("".join(text), calls, usage, finish, model or self.model_name)
        return with_reasoning(response, self._reasoning_parts(thought))

    @staticmethod
    def _merge_call(slots: dict[int, dict[str, Any]], tc: dict[str, Any]) -> None:
        """Fold one tool-call delta in: id and name come first, arguments in fragments."""
        index = tc.get("index")
        if not isinstance(index, int):  # servers that omit the index: a new id opens a call
            known = {s["id"] for s in slots.values()}
            fresh = tc.get("id") and tc["id"] not in known
            index = len(slots) if fresh else max(slots, default=0)
        slot = slots.setdefault(index, {"id": None, "name": "", "args": []})
        if tc.get("id") and not slot["id"]:
            slot["id"] = tc["id"]
        fn = tc.get("function") or {}
        if fn.get("name") and not slot["name"]:
            slot["name"] = str(fn["name"])
        args = fn.get("arguments")
        if isinstance(args, dict):  # a whole object at once, as some servers send
            slot["args"] = [json.dumps(args)]
        elif isinstance(args, str):
            slot["args"].append(args)

    def _stream_error(self, err: Any) -> ProviderError:
        message, code = self.error_details({"error": err})
        detail = f" ({code})" if code else ""
        return ProviderError(f"openai: error from {self.url}{detail}: {truncate(message)}")


# -- reasoning (issue 17) ---------------------------------------------------------------------

#: The option (recorded on ``turn/start`` like every option, never sent as a body field) that
#: says which recorded ``reasoning_content`` goes back to the server; see
#: :func:`replayed_messages`. Absent means :data:`DEFAULT_REASONING_REPLAY`.
REASONING_REPLAY = "reasoning_replay"
#: ``none``: never sent back (DeepSeek's deepseek-reasoner guide: a 400 if it is);
#: ``tool_turns``: sent back on the assistant messages of every user turn that made tool calls
#: (DeepSeek's thinking-mode guide: required there, ignored elsewhere); ``all``: every one.
REASONING_REPLAY_VALUES = ("none", "tool_turns", "all")
DEFAULT_REASONING_REPLAY = "tool_turns"
#: Readable and opaque reasoning of one response, in characters, beyond which the response is
#: refused (a runaway or hostile server): it is recorded and replayed, so it is not cut.
MAX_REASONING_CHARS = 8_000_000


def report_reasoning(owner: Any, delta: str) -> None:
    """Hand one streamed reasoning delta to whoever shows reasoning (``--show-reasoning``):
    the caller's ``on_reasoning``, through :meth:`HTTPModel.emit_reasoning` where the core has
    it. The one place this family's adapters report reasoning as it streams; never
    ``on_text``, so reasoning never reaches stdout as the answer."""
    emit = getattr(owner, "emit_reasoning", None)
    if emit is not None and delta:
        emit(delta)


def reasoning_replay(options: Any, where: str) -> str:
    """The recorded replay policy of a request's options (a ConfigError for a bad value)."""
    value = options.get(REASONING_REPLAY, DEFAULT_REASONING_REPLAY)
    if value not in REASONING_REPLAY_VALUES:
        raise ConfigError(f"{where}: `{REASONING_REPLAY}` must be one of "
                          f"{', '.join(REASONING_REPLAY_VALUES)}, got {value!r}")
    return str(value)


def own_reasoning(m: Message, provider: str, *kinds: str) -> list[Reasoning]:
    """The parts of ``m`` that ``provider`` wrote (another family's parts are never sent)."""
    return [r for r in m.reasoning if r.provider == provider and r.kind in kinds]


def replayed_messages(messages: Any, policy: str) -> set[int]:
    """Indexes of the assistant messages whose ``reasoning_content`` is sent back."""
    if policy == "none":
        return set()
    chosen: set[int] = set()
    segment: list[int] = []  # the assistant messages since the last user message
    tools = False
    for i, m in enumerate(messages):
        if m.role == "user":
            if tools or policy == "all":
                chosen.update(segment)
            segment, tools = [], False
        elif m.role == "assistant" and m.reasoning:
            segment.append(i)
        if m.role == "assistant" and m.tool_calls:
            tools = True
    if tools or policy == "all":
        chosen.update(segment)
    return chosen


class ReasoningText:
    """Reasoning text as it streams: bounded (:data:`MAX_REASONING_CHARS`), reported."""

    def __init__(self, owner: Any) -> None:
        self.owner = owner
        self.parts: list[str] = []
        self.size = 0
        self.seen = False  # the server sent the field (even empty): replayed as sent
        self.safe = StreamText()

    def add(self, delta: str, show: bool = True) -> None:
        self.seen = True
        self.size += len(delta)
        if self.size > MAX_REASONING_CHARS:
            raise too_much_reasoning(self.owner, MAX_REASONING_CHARS)
        self.parts.append(delta)
        if show:
            shown = self.safe.feed(delta)
            if shown:
                report_reasoning(self.owner, shown)

    def text(self) -> str:
        rest = self.safe.flush()
        if rest:
            report_reasoning(self.owner, rest)
        return clean_text(join_pairs("".join(self.parts)))[0]


def too_much_reasoning(owner: Any, limit: int) -> ProviderError:
    return ProviderError(
        f"{owner.provider}: malformed response from {owner.url}: its reasoning exceeds "
        f"{limit} characters (a runaway or hostile server); nothing was recorded")


def _reasoning_field(d: dict[str, Any]) -> str | None:
    """``reasoning_content`` (DeepSeek, llama.cpp, older vLLM), else ``reasoning`` (vLLM 0.11+,
    OpenRouter): only a string counts (OpenRouter's request field is an object)."""
    value = d.get("reasoning_content")
    if isinstance(value, str):
        return value
    value = d.get("reasoning")
    return value if isinstance(value, str) else None


def with_reasoning(response: ModelResponse, parts: list[Reasoning]) -> ModelResponse:
    return attrs.evolve(response, reasoning=tuple(parts)) if parts else response
