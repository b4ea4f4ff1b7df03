"""The ``llm:MODEL_ID`` adapter: a dsh :class:`~dsh.llm.base.Model` that runs a model of the
``llm`` CLI through its plugin's own ``execute``.

What one request does (every request, MISSION C4 — nothing is kept between them):

1. the sealed :class:`~dsh.core.messages.ModelRequest` dsh's transport hands over is translated
   into llm's objects by :func:`build_response` — a fresh :class:`llm.Conversation` whose
   earlier :class:`llm.Response` objects are rebuilt from the request's messages (for
   plugins that read ``conversation.responses``), and a :class:`llm.Prompt` carrying the
   whole chain as ``messages=`` (for plugins that read ``prompt.messages``, llm >= 0.36),
   the system prompt, the new turn's text and tool results, the tool schemas and the options
   validated by the model's own ``Options`` class;
2. the response is driven by iterating it (``Response.__iter__`` calls the plugin's
   ``execute``); text deltas go to ``on_text`` when the request streams;
3. text, tool calls (``response.tool_calls()``) and usage (``response.usage()``) become a
   :class:`~dsh.core.messages.ModelResponse`.

Nothing is written to llm's database: the bridge never calls ``Response.log_to_db`` nor
anything of ``llm.cli`` (the CLI is what logs), and the Conversation is built per request
and dropped. API keys are llm's own business (``llm keys set``, the plugin's environment
variable); the key is never part of the request, so it never reaches the ledger, and it is
registered with :mod:`dsh.redact` so that no error message can show it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from dsh.core.errors import ConfigError
from dsh.core.errors import DshError
from dsh.core.errors import ProviderError
from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import ToolCall
from dsh.core.messages import ToolSpec
from dsh.core.messages import Usage
from dsh.core.messages import thaw
from dsh.core.redact import redact
from dsh.llm.base import Model
from dsh.llm.base import TextCallback
from dsh.llm.base import parse_tool_arguments


def import_llm() -> Any:
    """The ``llm`` module, or a :class:`ConfigError` saying how to install it."""
    try:
        import llm
    except ImportError as exc:
        raise ConfigError(f"llm: the llm package cannot be imported ({exc}); install it with "
                          "`pip install dsh-llm` (which depends on llm)") from None
    return llm


def plugin_of(model: Any) -> str:
    """The distribution (or module) of the llm plugin that defines ``model``."""
    module = type(model).__module__ or ""
    top = module.split(".")[0]
    if top == "llm":
        return "llm (built in)"
    try:
        from importlib.metadata import packages_distributions

        dists = packages_distributions().get(top)
    except Exception:  # noqa: BLE001 - a broken environment only loses the name
        dists = None
    return dists[0] if dists else top


def resolve_model(name: str) -> Any:
    """The llm model ``name`` (a model id or one of llm's aliases), or a ConfigError."""
    llm = import_llm()
    if not name:
        raise ConfigError("llm: no model id: write llm:MODEL_ID (list them: dsh llm models)")
    try:
        return llm.get_model(name)
    except llm.UnknownModelError as exc:
        detail = str(exc).strip("'\"")
        hint = (" (only an async model exists: dsh runs llm's sync models)"
                if "async model exists" in detail else "")
        raise ConfigError(f"llm:{name}: unknown llm model{hint}; `dsh llm models` lists the "
                          "models of the installed llm plugins") from None


def make_options(model: Any, options: Mapping[str, Any], where: str) -> Any:
    """``options`` validated by the model plugin's own ``Options`` class (pydantic)."""
    try:
        return model.Options(**thaw(options))
    except Exception as exc:  # pydantic.ValidationError: one line per field
        errors = getattr(exc, "errors", None)
        problems: list[str] = []
        if callable(errors):
            for e in errors():
                loc = ".".join(str(x) for x in e.get("loc", ())) or "options"
                msg = e.get("msg", "invalid")
                if e.get("type") == "extra_forbidden":
                    known = ", ".join(sorted(getattr(model.Options, "model_fields", {})))
                    msg = f"unknown option (known: {known or 'none'})"
                problems.append(f"{loc!r}: {msg}")
        text = "; ".join(problems) or f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"{where}: option {text} (checked by "
                          f"{type(model).__name__}.Options of {plugin_of(model)})") from None


def _tool_result(llm: Any, m: Any) -> Any:
    return llm.ToolResult(name=m.name or "", output=m.content, tool_call_id=m.tool_call_id,
                          exception=Exception(m.content) if m.is_error else None)


def build_response(model: Any, request: ModelRequest, tools: Sequence[Any], stream: bool,
                   where: str) -> Any:
    """The :class:`llm.Response` that sends ``request`` to ``model`` (not yet executed).

    The request's messages are split into turns at each assistant message: the input of a
    turn is the user messages and tool results after the previous answer. Every earlier turn
    becomes a finished ``llm.Response`` (its prompt text, tool results, answer text and tool
    calls) in a fresh ``llm.Conversation``; the last turn's input becomes the new prompt. The
    full chain, in order, is given to the new prompt as ``messages=`` (llm's authoritative
    history).
    """
    llm = import_llm()
    from llm.parts import Message as LMessage
    from llm.parts import TextPart
    from llm.parts import ToolCallPart
    from llm.parts import ToolResultPart

    raw = dict(request.options)
    schema = raw.pop("output_schema", None)  # dsh run --schema (dsh.llm.schema.OPTION)
    options = make_options(model, raw, where)
    if schema is not None:  # llm's own schema support, where the model has it
        schema = thaw(schema) if getattr(model, "supports_schema", False) else None
    system = request.system or None
    conversation = llm.Conversation(model=model)
    chain: list[Any] = []
    if system:
        chain.append(LMessage(role="system", parts=[TextPart(text=system)]))
    texts: list[str] = []
    results: list[Any] = []

    def prompt(messages: list[Any] | None) -> Any:
        return llm.Prompt("\n\n".join(texts) or None, model, system=system,
                          tool_results=list(results), tools=list(tools), options=options,
                          messages=messages, schema=schema)

    for m in request.messages:
        if m.role == "tool":
            result = _tool_result(llm, m)
            results.append(result)
            part = ToolResultPart(name=result.name, output=result.output,
                                  tool_call_id=result.tool_call_id,
                                  exception=m.content if m.is_error else None)
            if chain and chain[-1].role == "tool":
                chain[-1].parts.append(part)
            else:
                chain.append(LMessage(role="tool", parts=[part]))
        elif m.role == "assistant":
            # An earlier turn's prompt carries only that turn's input (its prompt.messages
            # are synthesised from it): giving each a copy of the chain so far would make a
            # request cost O(n²) in the session's length. The new prompt carries it all.
            done = llm.Response(prompt(None), model, stream=False, conversation=conversation)
            parts: list[Any] = [TextPart(text=m.content)] if m.content else []
            parts += [ToolCallPart(name=c.name, arguments=thaw(c.arguments),
                                   tool_call_id=c.id) for c in m.tool_calls]
            answer = LMessage(role="assistant", parts=parts)
            # A finished response, as llm's own Response.from_dict rebuilds one.
            done._chunks = [m.content] if m.content else []
            done._loaded_messages = [answer]
            done._tool_calls = [llm.ToolCall(name=c.name, arguments=thaw(c.arguments),
                                             tool_call_id=c.id) for c in m.tool_calls]
            done._done = True
            conversation.responses.append(done)
            chain.append(answer)
            texts.clear()
            results.clear()
        else:  # user (and any other role a plugin recorded) is the user's input
            texts.append(m.content)
            chain.append(LMessage(role="user", parts=[TextPart(text=m.content)]))
    return llm.Response(prompt(chain), model, stream=stream, conversation=conversation)


class LLMModel(Model):
    """``llm:MODEL_ID``: a model of the llm CLI, run in-process by its plugin."""

    can_stream = True

    def __init__(self, name: str, settings: Mapping[str, Any] | None = None) -> None:
        super().__init__(name, settings)
        self.where = f"llm:{name}"
        self._llm_model: Any = None

    def __repr__(self) -> str:
        return f"LLMModel({self.name!r})"

    @property
    def llm_model(self) -> Any:
        """The llm model object (resolved on first use: this imports llm and its plugins)."""
        if self._llm_model is None:
            self._llm_model = resolve_model(self.name)
            self.can_stream = bool(getattr(self._llm_model, "can_stream", False))
        return self._llm_model

    @property
    def plugin(self) -> str:
        return plugin_of(self.llm_model)

    @property
    def effective_id(self) -> str | None:
        """``llm:gpt-4o-mini`` when the id used one of llm's aliases (``llm:4o-mini``) or a
        ``[models.NAME]`` alias (``adapter = "llm"``); ``None`` when the id says it already."""
        model_id = getattr(self.llm_model, "model_id", self.name)
        if model_id == self.name and "adapter" not in self.settings:
            return None
        return f"llm:{model_id}"

    def check(self) -> None:
        """Before any request: the model exists, is a sync model, its key is found by llm's
        own lookup (``llm keys``, the plugin's environment variable), and the configured
        options pass its ``Options`` class."""
        llm = import_llm()
        model = self.llm_model
        if not isinstance(model, llm.Model | llm.KeyModel):
            raise ConfigError(f"{self.where}: {type(model).__name__} is not a sync llm model")
        if getattr(model, "needs_key", None):
            try:
                key = model.get_key()
            except llm.NeedsKeyException as exc:
                raise ProviderError(f"{self.where}: {exc}") from None
            from dsh.core import redact as redact_mod

            redact_mod.register(key)
        configured = self.settings.get("options") or {}
        if isinstance(configured, Mapping):
            make_options(model, configured, f"{self.where}: [models] options")

    def default_options(self) -> dict[str, Any]:
        """The plugin's own option defaults that are set (not ``None``), as JSON values: they
        are recorded on ``turn/start`` with the configured options (C3), so the ledger shows
        every option the plugin receives."""
        try:
            defaults = self.llm_model.Options().model_dump(mode="json")
        except Exception:  # noqa: BLE001 - an Options class without defaults for every field
            return {}
        return {k: v for k, v in defaults.items() if v is not None}

    def format_tool(self, tool: ToolSpec) -> Any:
        """An ``llm.Tool`` without implementation (dsh runs the tools); refused for a model
        whose plugin does not support tools — this runs when the session opens."""
        llm = import_llm()
        model = self.llm_model
        if not getattr(model, "supports_tools", False):
            raise ConfigError(
                f"{self.where}: the llm model {model.model_id!r} ({plugin_of(model)}) does not "
                f"support tools, and this agent has {tool.name!r}: give the agent no tools "
                "(`tools = []` in its [agents.NAME] table) or use a model that supports them "
                "(`dsh llm models` marks them)")
        return llm.Tool(name=tool.name, description=tool.description or None,
                        input_schema=thaw(tool.parameters) or {"type": "object",
                                                               "properties": {}})

    def complete(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelResponse:
        """One llm prompt, reached only through dsh's transport (C3)."""
        from dsh.host.runcontext import current_or_none

        ctx = current_or_none()
        cancel = ctx.cancel if ctx is not None else None
        if cancel is not None:
            cancel.check()
        model = self.llm_model
        tools = self.provider_tools(request.tools) if request.tools else []
        stream = bool(request.stream and on_text is not None and self.can_stream)
        try:
            response = build_response(model, request, tools, stream, self.where)
        except DshError:
            raise
        except Exception as exc:  # ConversationNotSupported, a plugin's own complaint
            raise ProviderError(f"{self.where}: {type(exc).__name__}: {exc}") from None
        chunks = iter(response)
        try:
            for chunk in chunks:
                if cancel is not None and cancel.cancelled:
                    break
                if stream and chunk and on_text is not None:
                    try:
                        on_text(chunk)
                    except Exception as exc:
                        raise _CallbackFailed(exc) from None
            if cancel is not None:
                cancel.check()
            text = response.text()
            calls = response.tool_calls()
            usage = response.usage()
        except DshError:
            raise
        except _CallbackFailed as failed:
            raise failed.error from failed.error.__cause__
        except Exception as exc:
            detail = " ".join(str(exc).split())  # one line, whatever the plugin wrote
            message = redact(f"{self.where} ({plugin_of(model)}): {type(exc).__name__}: "
                             f"{detail}")
            raise ProviderError(message) from None
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        tool_calls = [ToolCall(id=c.tool_call_id or f"call_{i}", name=c.name,
                               arguments=parse_tool_arguments(_arguments(c.arguments)))
                      for i, c in enumerate(calls)]
        return ModelResponse(
            text=text, tool_calls=tool_calls,
            usage=Usage(input_tokens=int(usage.input or 0), output_tokens=int(usage.output or 0)),
            stop_reason=None,  # llm does not report one
            tool_call_source="native" if tool_calls else None,
            model=response.resolved_model or getattr(model, "model_id", self.name),
        )


def _arguments(raw: Any) -> Any:
    """A plugin's tool-call arguments: a dict, or JSON text (some plugins keep it raw)."""
    if isinstance(raw, dict | str) or raw is None:
        return raw
    try:
        return json.loads(json.dumps(raw))
    except (TypeError, ValueError):
        return str(raw)


class _CallbackFailed(BaseException):
    """Carries an exception of the caller's ``on_text`` past the adapter's error mapping."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


__all__ = ["LLMModel", "build_response", "make_options", "plugin_of", "resolve_model"]
