"""The model adapter interface (MISSION A2).

An adapter is a :class:`Model`: given a provider-neutral :class:`~dsh.core.messages.ModelRequest`
it returns a :class:`~dsh.core.messages.ModelResponse`. Adapters are registered by a *prefix*
through
the ``register_models`` hook; the model id ``"openai:gpt-4o-mini"`` asks the factory registered
as ``openai`` for the model ``gpt-4o-mini``. A factory may be given as a ``"module:attr"`` string
so that the adapter's module (and httpx) is imported only when that model is used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import attrs

from dsh.core.messages import ModelRequest
from dsh.core.messages import ModelResponse
from dsh.core.messages import ToolSpec
from dsh.core.messages import freeze
from dsh.llm import transport

#: Called with each text delta while a response streams.
TextCallback = Callable[[str], None]
#: Called with each reasoning (thinking) delta while a response streams: never answer text.
ReasoningCallback = Callable[[str], None]


class Model:
    """Base class of model adapters.

    :param name: the part of the model id after ``prefix:`` (``"gpt-4o-mini"``), or the whole
        id for adapters registered without a prefix (``"echo"``).
    :param settings: the model's settings from the config (``[models.ID]``): typically
        ``base_url``, ``api_key_env``, ``api_key``, ``options``, ``timeout``, ``retries``.
    """

    #: False for adapters that cannot stream; the loop then never asks them to.
    can_stream: bool = True
    #: Keys ``options`` may not set (beyond :data:`dsh.llm.record.PROTOCOL_KEYS`): the
    #: adapter's own protocol fields. Checked when the agent's options are merged.
    reserved_options: frozenset[str] = frozenset()
    #: Media types the adapter can send as attachments (issue 17); empty: it takes none, and
    #: a message with attachments is refused before anything is sent, naming the model.
    attachment_types: frozenset[str] = frozenset()
    #: Set when the provider answered a request's attachments with a 4xx saying it takes
    #: none: later ones are refused before anything is sent (for this process).
    attachments_refused: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Every adapter's complete() goes through dsh's transport, whoever wrote it (C3): it
        # runs only for the sealed request the transport hands it.
        super().__init_subclass__(**kwargs)
        fn = cls.__dict__.get("complete")
        if fn is not None:
            cls.complete = transport.guard(fn)  # type: ignore[method-assign]

    def __init__(self, name: str, settings: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.settings: Mapping[str, Any] = settings or {}
        self._tools_memo: tuple[Sequence[ToolSpec], list[Any]] | None = None
        #: How many times a tool table was converted to the provider's format (D1: once).
        self.tool_conversions = 0

    @property
    def effective_id(self) -> str | None:
        """The model id as the provider will be asked for it (``openai:gpt-4o-mini`` for an
        alias whose settings say ``model = "gpt-4o-mini"``), recorded on ``turn/start``;
        ``None`` when the configured id says it already."""
        return None

    def default_options(self) -> Mapping[str, Any]:
        """Options the adapter sends unless the configuration sets them (recorded with the
        others on ``turn/start``, MISSION C3)."""
        return {}

    def format_tool(self, tool: ToolSpec) -> Any:
        """One tool schema in the provider's wire format (adapters override this)."""
        return {"name": tool.name, "description": tool.description,
                "parameters": tool.parameters}

    def provider_tools(self, tools: Sequence[ToolSpec]) -> list[Any]:
        """``tools`` in the provider's format, memoised (MISSION D1), read-only (C3).

        The app converts the agent's tool table when a session opens; every request of the
        run then finds it here (an identity test, or equality for a table loaded from the
        ledger on resume) and converts nothing. The converted table is frozen: a plugin
        cannot change a schema in it on its way to the wire.
        """
        memo = self._tools_memo
        if memo is not None:
            if memo[0] is tools:
                return memo[1]
            if memo[0] == tools:  # an equal table (the transport's own copy, a resumed one)
                self._tools_memo = (tools, memo[1])  # identity from now on
                return memo[1]
        converted = freeze([self.format_tool(t) for t in tools])
        self._tools_memo = (tools, converted)
        self.tool_conversions += 1
        return converted

    def accepts_attachment(self, media_type: str) -> bool:
        """Whether this model may be sent an attachment of ``media_type``: the adapter
        declares the type (:attr:`attachment_types`) and the model's settings allow it —
        ``attachments = false`` refuses every one, a list of media types all but those."""
        allowed = self.settings.get("attachments", True)
        if allowed is False or self.attachments_refused:
            return False
        if isinstance(allowed, list | tuple):
            if not all(isinstance(t, str) for t in allowed):
                allowed = None
            elif media_type not in allowed:
                return False
        if allowed is None or not isinstance(allowed, bool | list | tuple):
            from dsh.core.errors import ConfigError

            raise ConfigError(f"model {self.name!r}: `attachments` must be true, false or a "
                              "list of media types (\"image/png\", \"application/pdf\", …)")
        return media_type in self.attachment_types

    def check(self) -> None:
        """Validate what can be validated before any request (a missing API key, a missing
        file). Raise :class:`~dsh.core.errors.ProviderError` or
        :class:`~dsh.core.errors.ConfigError`."""

    def complete(self, request: ModelRequest, on_text: TextCallback | None = None) -> ModelResponse:
        """Send ``request`` and return the resolved response.

        Only dsh's transport calls this (:func:`dsh.llm.transport.send`): every subclass's
        ``complete`` is wrapped so that it refuses any other caller. Build the wire request
        from ``request`` alone — its fields are what the ledger records — and never merge
        settings of your own into it (options come recorded, in ``request.options``).

        When ``request.stream`` is true and ``on_text`` is given, call ``on_text(delta)`` with
        each text delta as it arrives. An adapter that streams reasoning declares a third,
        optional parameter ``on_reasoning: ReasoningCallback | None = None`` and calls it with
        each reasoning delta (thinking text, ``reasoning_content``) — never ``on_text``:
        reasoning is not the answer. The transport passes ``on_reasoning`` only to adapters
        whose ``complete`` declares it (adapters written before it existed keep working);
        :class:`~dsh.llm.http.model.HTTPModel` subclasses call ``self.emit_reasoning(delta)`` from
        ``parse_stream`` instead. Inside a run, honour ``dsh.context().cancel`` (close
        the in-flight request when it fires) and reuse the run's HTTP client.
        Raise :class:`~dsh.core.errors.ProviderError` for failures the user can act on.
        """
        raise NotImplementedError


ModelFactory = Callable[[str, Mapping[str, Any]], Model]


@attrs.frozen
class ModelEntry:
    """A registered adapter prefix: where it came from and how to build it."""

    prefix: str
    factory: ModelFactory | str
    plugin: str
    description: str = ""
    #: What ``dsh models`` lists under the prefix: a callable (or ``"module:attr"``, imported
    #: only by ``dsh models``) returning ``[{"id": "PREFIX:NAME", "plugin": …}, …]``; None:
    #: the adapter takes any name.
    listing: Callable[[], list[dict[str, Any]]] | str | None = None

    def list_models(self) -> list[dict[str, Any]]:
        """The models the adapter knows (``[]`` without a listing)."""
        listing = self.listing
        if listing is None:
            return []
        if isinstance(listing, str):
            import importlib

            module_name, _, attr = listing.partition(":")
            listing = getattr(importlib.import_module(module_name), attr)
        return list(listing())

    def build(self, name: str, settings: Mapping[str, Any]) -> Model:
        factory = self.factory
        if isinstance(factory, str):
            import importlib

            module_name, _, attr = factory.partition(":")
            factory = getattr(importlib.import_module(module_name), attr)
        return factory(name, settings)


#: The key under which tool-call arguments that are not a JSON object are kept.
INVALID_JSON_KEY = "__invalid_json__"


#: Tool-call arguments nested deeper than this are not read (:func:`parse_tool_arguments`):
#: no tool schema goes near it, and the ledger must be able to read back what it records.
MAX_ARGUMENT_DEPTH = 64


def parse_tool_arguments(raw: Any) -> dict[str, Any]:
    """Decode a tool call's arguments. Never raises: text that is not a JSON object — or
    one nested more than :data:`MAX_ARGUMENT_DEPTH` levels deep — becomes
    ``{"__invalid_json__": text}``, which fails the tool's schema validation in the core, so
    the model receives an error result it can read and correct."""
    from dsh.core.sanitize import has_nonfinite
    from dsh.core.sanitize import loads_strict
    from dsh.core.sanitize import nesting_depth

    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        if nesting_depth(raw, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
            return {INVALID_JSON_KEY: f"(arguments nested more than {MAX_ARGUMENT_DEPTH} "
                                      "levels deep, not read)"}
        if has_nonfinite(raw):  # NaN is not JSON: it could be neither recorded nor sent back
            return {INVALID_JSON_KEY: "(arguments hold NaN or an infinity, which JSON has "
                                      "no numbers for)"}
        return raw
    if isinstance(raw, str):
        try:
            value = loads_strict(raw)
        except (ValueError, RecursionError):
            return {INVALID_JSON_KEY: raw}
        if isinstance(value, dict):
            if nesting_depth(value, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
                return {INVALID_JSON_KEY: raw}
            return value
    try:
        shown = raw if isinstance(raw, str) else json.dumps(raw)
    except (TypeError, ValueError, RecursionError):
        shown = repr(raw)[:200]
    return {INVALID_JSON_KEY: shown}
