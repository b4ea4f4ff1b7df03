"""The llm subsystem as a built-in plugin: model registration and the core of the chat chain.

The ``request`` implementation here is the innermost layer of the onion (``trylast``):

1. it hands the request to the transport (:mod:`dsh.llm.transport`), which checks invariant
   C3 where bytes leave — the request must be exactly what the ledger records — and calls
   the agent's adapter (streaming only when someone observes, D7);
2. it decides whether the answer is a tool call, rescuing calls written as text (D5).

Replacing this implementation does not skip the check: adapters refuse requests that did not
come through the transport.

There is deliberately no hook between 3 and the adapter's answer: switching models never
changes how tool calls are decided.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.errors import ConfigError
from dsh.core.errors import ProviderError
from dsh.core.messages import MessageView
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import ToolCall
from dsh.core.messages import Usage
from dsh.core.sanitize import nesting_depth
from dsh.hookspecs import hookimpl
from dsh.host.runcontext import current_or_none
from dsh.llm import invariant
from dsh.llm import transport
from dsh.llm.base import MAX_ARGUMENT_DEPTH
from dsh.llm.base import Model
from dsh.llm.base import TextCallback
from dsh.llm.base import parse_tool_arguments

if TYPE_CHECKING:
    from dsh.host.scope import AgentHandle


class ModelCall:
    """The mutable envelope of one model request travelling through the ``request`` chain.

    Wrappers swap ``request`` (deeply frozen) with ``attrs.evolve``; they cannot change hook
    kwargs. Setting ``request`` or ``model`` remembers the code that did it, so a request the
    transport refuses names the plugin that changed it (MISSION C3).
    """

    __slots__ = ("_request", "_model", "agent", "on_text", "expected", "changed_by", "_handle",
                 "on_reasoning")

    def __init__(self, request: ModelRequest, model: Model, agent: str = "",
                 on_text: TextCallback | None = None, expected: Any = None,
                 handle: AgentHandle | None = None,
                 on_reasoning: TextCallback | None = None) -> None:
        self._request = request
        self._model = model
        #: The agent's name (a string, as before issue 11; ``handle`` has the rest).
        self.agent = agent
        #: Receives text deltas as they stream (None when nobody watches: no streaming).
        self.on_text = on_text
        #: Receives reasoning deltas as they stream (None when nobody watches them).
        self.on_reasoning = on_reasoning
        self._handle = handle
        #: The projection the request was built from (informative: the transport checks
        #: against the session's own record, not against this).
        self.expected = expected
        #: ``(attribute, code object)`` of every change to ``request`` / ``model``.
        self.changed_by: list[tuple[str, Any]] = []

    @property
    def handle(self) -> AgentHandle:
        """The :class:`dsh.AgentHandle` of the agent: settings, stashes, plugin events."""
        if self._handle is None:
            raise AttributeError("this ModelCall was built outside a turn: it has no handle")
        return self._handle

    @property
    def request(self) -> ModelRequest:
        """The deeply frozen request; swap it with ``attrs.evolve`` (recorded first, C3)."""
        return self._request

    @request.setter
    def request(self, value: ModelRequest) -> None:
        self._request = value
        self.changed_by.append(("request", sys._getframe(1).f_code))

    @property
    def model(self) -> Model:
        """The agent's adapter (:class:`dsh.llm.base.Model`); replacing it does not skip C3."""
        return self._model

    @model.setter
    def model(self, value: Model) -> None:
        self._model = value
        self.changed_by.append(("model", sys._getframe(1).f_code))

    def __repr__(self) -> str:
        return f"ModelCall(agent={self.agent!r}, model={self._model!r})"


@hookimpl
def register_models(register: Callable[..., None]) -> None:
    register("echo", EchoModel, description="answers with the last message (offline, tests)")
    register("scripted", ScriptedModel, description="replays responses from a JSON file")
    register("openai", "dsh.llm.openai:OpenAIModel",
             description="OpenAI-compatible Chat Completions (OpenAI, Ollama, vLLM, llama.cpp)")
    register("anthropic", "dsh.llm.anthropic:AnthropicModel",
             description="Anthropic Messages API")
    register("openai-responses", "dsh.llm.responses:ResponsesModel",
             description="OpenAI Responses API (reasoning items replayed, store: false)")


def check_invariant(request: ModelRequest, expected: Any) -> None:
    """Fail loudly when the request differs from ``expected`` (a sealed request or a
    :class:`~dsh.ledger.history.Projection`), MISSION C3: :func:`dsh.llm.invariant.check`.

    Cheap by construction: the loop hands the provider an O(1) view of the projection, so the
    normal path is an identity test; only a request some layer rebuilt is compared by value.
    """
    invariant.check(request, expected)


@hookimpl(trylast=True)
def request(call: ModelCall) -> ModelResponse:
    req = call.request
    tool_names = [t.name for t in req.tools]
    stream = req.stream is True
    on_text = call.on_text if stream else None
    gate = None
    if on_text is not None and tool_names:
        from dsh.llm.rescue import StreamGate

        gate = StreamGate(tool_names)
        user_cb = on_text

        def on_text(delta: str) -> None:
            shown = gate.feed(delta)
            if shown:
                user_cb(shown)

    on_reasoning = getattr(call, "on_reasoning", None) if stream else None
    response = transport.send(req, on_text, model=call.model, call=call,
                              on_reasoning=on_reasoning)
    if gate is not None and call.on_text is not None:
        rest = gate.finish()
        if rest:
            call.on_text(rest)
    if not response.tool_calls and tool_names and might_be_tool_call(response.text):
        response = rescue(response, tool_names)
    return response


#: The largest script file of the scripted model read.
SCRIPT_CAP = 64 * 1024 * 1024
#: Every rescue format starts with one of these (or with ``{``/``[`` at the very start).
#: Checked before importing the parser, so a plain answer costs one scan and no import.
RESCUE_MARKERS = ("<tool_call>", "```", "<|python_tag|>", "<|python_start|>", "[TOOL_CALLS]",
                  "<function=")


def might_be_tool_call(text: str) -> bool:
    if not text:
        return False
    head = text.lstrip()[:1]
    return head in ("{", "[") or any(m in text for m in RESCUE_MARKERS)


def rescue(response: ModelResponse, tool_names: list[str]) -> ModelResponse:
    """Turn tool calls written as text into real ones (D5); record which format was used."""
    from dsh.llm.rescue import rescue_tool_calls

    found = rescue_tool_calls(response.text, tool_names)
    if found is None:
        return response
    calls = tuple(
        # arguments checked as a native call's are (depth; NaN/Infinity are not JSON)
        ToolCall(id=f"call_{i}_{abs(hash((response.text, i))) % 10**8:08d}", name=n,
                 arguments=parse_tool_arguments(a))
        for i, (n, a) in enumerate(found.calls)
    )
    return attrs.evolve(
        response, text=found.content, tool_calls=calls, tool_call_source=found.source
    )


# --------------------------------------------------------------------------------------------
# Built-in offline models
# --------------------------------------------------------------------------------------------


def _stream_words(text: str, on_text: TextCallback | None) -> None:
    if on_text is None:
        return
    start = 0
    while start < len(text):
        end = text.find(" ", start + 1)
        end = len(text) if end == -1 else end
        on_text(text[start:end])
        start = end


def _approx_tokens(text: str) -> int:
    return max(1, len(text) // 4) if text else 0


class EchoModel(Model):
    """``echo``: answers with the last message's text (the user's, stdin block included, or
    the last tool result). Needs no network and no key."""

    def complete(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelResponse:
        msgs = request.messages
        text = msgs[-1].content if len(msgs) else ""
        _stream_words(text, on_text)
        usage = Usage(input_tokens=_approx_tokens(request.system) + _approx_tokens(text),
                      output_tokens=_approx_tokens(text))
        return ModelResponse(text=text, usage=usage, stop_reason="end_turn", model="echo")


class ScriptedModel(Model):
    """``scripted:PATH``: replays ``{"responses": [...]}`` from a JSON file, in order.

    The position in the script is the number of assistant messages already in the request, so
    a resumed session continues the script where it stopped. Each response may have ``text``,
    ``tool_calls`` (``[{"name", "arguments", "id"?}]``), ``usage``, ``stop_reason``, and, to
    simulate failures, ``error`` (message) with ``status``. In the API, pass the responses as a
    list: ``ScriptedModel("", {"responses": [...]})``. ``delay`` (seconds) makes a response
    slow, waking early if the run is aborted.
    """

    can_stream = True

    def __init__(self, name: str, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(name, settings)
        self._responses: list[dict[str, Any]] | None = None
        responses = (settings or {}).get("responses")
        if responses is not None:
            self._responses = [_check_response(r, i, "responses") for i, r in enumerate(responses)]
        self._scan: tuple[int, int, int] = (0, 0, 0)  # (id of history list, scanned, count)

    def check(self) -> None:
        self.responses()

    def responses(self) -> list[dict[str, Any]]:
        if self._responses is None:
            path = Path(self.name).expanduser()
            from dsh.core import files

            try:  # bounded; a FIFO or a device is refused, not waited on
                data = json.loads(files.read_regular(path, SCRIPT_CAP).decode("utf-8"))
            except FileNotFoundError:
                raise ConfigError(f"scripted model: no file {path}") from None
            except files.NotRegular as exc:
                raise ConfigError(f"scripted model: {path} is {exc.kind}, not a regular "
                                  "file") from None
            except files.TooLarge:
                raise ConfigError(f"scripted model: {path} is larger than {SCRIPT_CAP} "
                                  "bytes") from None
            except OSError as exc:
                raise ConfigError(f"scripted model: cannot read {path}: "
                                  f"{files.reason(exc)}") from None
            except RecursionError:
                raise ConfigError(f"scripted model: {path} is nested too deeply to read") from None
            except ValueError as exc:
                raise ConfigError(f"scripted model: {path} is not valid JSON: {exc}") from None
            if not isinstance(data, dict) or not isinstance(data.get("responses"), list):
                raise ConfigError(f'scripted model: {path} must hold {{"responses": [...]}}')
            self._responses = [
                _check_response(r, i, str(path)) for i, r in enumerate(data["responses"])
            ]
        return self._responses

    def _position(self, msgs: Any) -> int:
        # Counting assistant messages incrementally keeps the per-step cost flat.
        if isinstance(msgs, MessageView):
            key = id(msgs._items)
            seen_key, scanned, count = self._scan
            if seen_key != key or scanned > len(msgs):
                scanned, count = 0, 0
            items = msgs._items
            for i in range(scanned, len(msgs)):
                if items[i].role == "assistant":
                    count += 1
            self._scan = (key, len(msgs), count)
            return count
        return sum(1 for m in msgs if m.role == "assistant")

    def complete(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelResponse:
        responses = self.responses()
        pos = self._position(request.messages)
        ctx = current_or_none()
        if ctx is not None:  # a compacted history has fewer answers than the session gave
            pos = max(pos, ctx.ledger.projection.answers)
        if pos >= len(responses):
            raise ProviderError(
                f"scripted model {self.name or '(list)'}: no response left "
                f"(all {len(responses)} used)"
            )
        r = responses[pos]
        if r.get("delay"):
            _wait(float(r["delay"]))
        if "error" in r:
            raise ProviderError(f"scripted: {r['error']}", status=r.get("status"))
        text = r.get("text", "")
        _stream_words(text, on_text)
        calls = tuple(
            ToolCall(id=c.get("id") or f"call_{pos}_{i}", name=c["name"],
                     arguments=c.get("arguments") or {})
            for i, c in enumerate(r.get("tool_calls", ()))
        )
        u = r.get("usage") or {}
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=u.get("input_tokens", 0),
                        output_tokens=u.get("output_tokens", 0)),
            stop_reason=r.get("stop_reason", "tool_use" if calls else "end_turn"),
            tool_call_source="native" if calls else None,
            model="scripted",
        )


def _wait(seconds: float) -> None:
    """Sleep like a slow provider would, but wake up when the run is aborted."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None:
        import time

        time.sleep(seconds)
        return
    ctx.cancel.wait(seconds)
    ctx.cancel.check()


def _check_response(r: Any, i: int, where: str) -> dict[str, Any]:
    if not isinstance(r, dict):
        raise ConfigError(f"scripted model: {where}: responses[{i}] must be an object")
    for j, c in enumerate(r.get("tool_calls", ())):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise ConfigError(
                f"scripted model: {where}: responses[{i}].tool_calls[{j}] needs a 'name'"
            )
        if not isinstance(c.get("arguments", {}), dict):
            raise ConfigError(
                f"scripted model: {where}: responses[{i}].tool_calls[{j}].arguments "
                "must be an object"
            )
        if nesting_depth(c.get("arguments", {}), MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
            raise ConfigError(
                f"scripted model: {where}: responses[{i}].tool_calls[{j}].arguments "
                f"are nested more than {MAX_ARGUMENT_DEPTH} levels deep"
            )
    return r


__all__ = ["EchoModel", "ModelCall", "ScriptedModel"]
