"""Provider-neutral value objects: messages, tool calls, usage, requests and responses.

Every model adapter translates from :class:`ModelRequest` and into :class:`ModelResponse`; the
agent loop and the ledger know nothing of any provider's wire format.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import overload

import attrs


class FrozenDict(dict[Any, Any]):
    """A ``dict`` that cannot be changed in place: what a request carries (MISSION C3).

    A ``dict`` subclass, so it serialises with ``json`` exactly as a dict does, compares equal
    to one and passes ``isinstance(x, dict)``; every mutating method raises ``TypeError``.
    Build it with :func:`freeze`, which freezes nested values too (the constructor itself
    is ``dict``'s: it freezes nothing inside). (Python's own
    ``dict.__setitem__(d, …)`` still writes into it: like ``object.__setattr__`` on a frozen
    attrs instance, that is deliberate tampering, not a mistake — see docs/architecture.md.)
    """

    __slots__ = ()

    def _readonly(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a request's mappings are read-only (MISSION C3); build a new request "
                        "with attrs.evolve and write what you add to the ledger")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly
    __ior__ = _readonly

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: Any) -> FrozenDict:
        return self

    def __reduce__(self) -> Any:
        return (FrozenDict, (dict(self),))


class FrozenList(list[Any]):
    """A ``list`` that cannot be changed in place (see :class:`FrozenDict`)."""

    __slots__ = ()

    def _readonly(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a request's lists are read-only (MISSION C3); build a new request "
                        "with attrs.evolve and write what you add to the ledger")

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = _readonly
    sort = reverse = __iadd__ = __imul__ = _readonly

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: Any) -> FrozenList:
        return self

    def __reduce__(self) -> Any:
        return (FrozenList, (list(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self))


#: Types needing no freezing: immutable scalars, and what is frozen already (its contents were
#: frozen when it was built).
_FINAL = frozenset({str, int, float, bool, type(None), FrozenDict, FrozenList})


def freeze(value: Any) -> Any:
    """``value`` with every nested mapping and list made read-only (O(1) when already frozen).

    JSON's shapes — mappings, lists and tuples — become :class:`FrozenDict` and
    :class:`FrozenList`; scalars and other objects are kept as they are.
    """
    if type(value) in _FINAL:
        return value
    if isinstance(value, dict) or isinstance(value, Mapping):  # dict first: no ABC check
        for v in value.values():
            if type(v) not in _FINAL:
                return FrozenDict({k: freeze(v) for k, v in value.items()})
        return FrozenDict(value)  # the common case: scalars only
    if isinstance(value, list | tuple):
        for v in value:
            if type(v) not in _FINAL:
                return FrozenList([freeze(v) for v in value])
        return FrozenList(value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of a frozen value (for code that wants to change its copy,
    such as a tool receiving its arguments)."""
    t = type(value)
    if t in _SCALARS:
        return value
    if isinstance(value, dict) or isinstance(value, Mapping):  # dict first: no ABC check
        plain = dict(value)
        for k, v in plain.items():
            if type(v) not in _SCALARS:
                plain[k] = thaw(v)
        return plain
    if isinstance(value, list | tuple):
        return [v if type(v) in _SCALARS else thaw(v) for v in value]
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})


_EMPTY = FrozenDict()


def _freeze_args(value: Mapping[str, Any] | None) -> FrozenDict:
    if type(value) is FrozenDict:
        return value
    if not value:
        return _EMPTY
    frozen: FrozenDict = freeze(value)
    return frozen


def _calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(value)


def _messages(value: Iterable[Message]) -> Sequence[Message]:
    # a view of the ledger's projection is immutable already (the normal path: O(1))
    return value if type(value) is MessageView or type(value) is tuple else tuple(value)


def _specs(value: Iterable[ToolSpec]) -> tuple[ToolSpec, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call the model asked for. ``arguments`` is the decoded JSON object."""

    #: The call's id (the provider's, or one dsh made for a rescued call).
    id: str
    #: The tool's name.
    name: str
    #: The decoded JSON arguments, deeply frozen.
    arguments: Mapping[str, Any] = attrs.field(factory=FrozenDict, converter=_freeze_args,
                                               hash=False)


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts of one model response (zero when the provider reports none)."""

    #: Every input token the provider processed for the request, cached ones included.
    input_tokens: int = 0
    #: Tokens the model generated (reasoning included, when the provider counts it there).
    output_tokens: int = 0
    #: The part of ``input_tokens`` read from the provider's prompt cache (billed cheaper).
    cache_read_tokens: int = 0
    #: The part of ``input_tokens`` written to the provider's prompt cache (billed dearer).
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """``input_tokens + output_tokens``."""
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


@attrs.frozen(kw_only=True)
class Reasoning:
    """One part of a model's reasoning, recorded so it can be replayed exactly as its provider
    requires (issue 17). Never part of the answer: stdout does not show it.

    ``kind`` is the provider's own name for the part: ``thinking`` (Anthropic: ``text`` and
    ``signature``), ``redacted_thinking`` (Anthropic: opaque ``data``), ``reasoning_content``
    (OpenAI-compatible servers: ``text``), ``reasoning`` (OpenAI Responses API: ``id``, a
    summary in ``text``, encrypted content in ``data``). ``provider`` names the adapter family
    that produced it (``anthropic``, ``openai``, ``openai-responses``); an adapter replays only
    its own family's parts.
    """

    #: The provider's name for the part (see above).
    kind: str
    #: The adapter family that produced it; parts of another family are not sent.
    provider: str
    #: Readable reasoning text (or a summary of it); empty for opaque parts.
    text: str = ""
    #: Anthropic's signature over a ``thinking`` block, sent back unchanged.
    signature: str | None = None
    #: Opaque provider data (redacted or encrypted reasoning), sent back unchanged.
    data: str | None = None
    #: The provider's id of the part (OpenAI Responses reasoning items).
    id: str | None = None


@attrs.frozen(kw_only=True)
class Attachment:
    """A file sent with a user message (issue 17): stored once by content hash beside the
    ledger; the ledger records only this reference."""

    #: Hex SHA-256 of the content: the name it is stored under.
    sha256: str
    #: MIME type, such as ``image/png`` or ``application/pdf``.
    media_type: str
    #: Size in bytes.
    size: int
    #: Where it came from (a file name or URL), for display only.
    name: str | None = None


@attrs.frozen(kw_only=True)
class FragmentRef:
    """A text fragment sent before a user message's text (``dsh run -f``): stored once by
    content hash beside the ledger, like an attachment; the ledger records only this
    reference, and the model reads it as a ``<fragment name="NAME">`` block
    (:mod:`dsh.ledger.fragments`)."""

    #: Hex SHA-256 of the text's UTF-8 bytes: the name it is stored under.
    sha256: str
    #: Size of the UTF-8 bytes.
    size: int
    #: The name its block shows (the path as given, or the URL without its query).
    name: str


@attrs.frozen(kw_only=True)
class Change:
    """One file a tool call changed, as recorded on its ``tool/result`` (``changes``).

    The diff is what rewind, replay, ``sessions show``, the HTML page and ACP render or
    apply; the disk is never re-read to show a change. Build one with
    :func:`dsh.tools.changes.record` inside a tool.
    """

    #: The path relative to the workspace (for a move: the old path).
    path: str
    #: ``add``, ``update``, ``delete`` or ``move`` (a move may also change the content).
    op: str
    #: The unified diff (``--- a/PATH`` / ``+++ b/PATH``), complete unless ``complete`` is
    #: false (a diff over :data:`dsh.tools.changes.MAX_RECORDED` bytes keeps only its start).
    diff: str = ""
    #: Lines added (what OpenTelemetry gets, never the text).
    added: int = 0
    #: Lines removed.
    removed: int = 0
    #: For a move: the new path.
    moved_to: str | None = None
    #: Hex SHA-256 of the file's bytes before the change (``None``: it did not exist).
    before_sha256: str | None = None
    #: Hex SHA-256 after it (``None``: deleted), so a rewind can tell whether the disk
    #: still holds what the tool wrote.
    after_sha256: str | None = None
    #: False when ``diff`` was cut to stay bounded.
    complete: bool = True


def _reasoning(value: Iterable[Reasoning]) -> tuple[Reasoning, ...]:
    return value if type(value) is tuple else tuple(value)


def _attachments(value: Iterable[Attachment]) -> tuple[Attachment, ...]:
    return value if type(value) is tuple else tuple(value)


@attrs.frozen(kw_only=True)
class Message:
    """One entry of the model's history.

    ``role`` is ``"user"``, ``"assistant"`` or ``"tool"`` (the system prompt travels separately
    on the request). A tool message carries ``tool_call_id`` and ``name``; ``is_error`` marks a
    failed tool result.
    """

    #: ``user``, ``assistant`` or ``tool``.
    role: str
    #: The text (a tool message: the tool's output).
    content: str = ""
    #: An assistant message's tool calls.
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    #: A tool message: the id of the call it answers.
    tool_call_id: str | None = None
    #: A tool message: the tool's name.
    name: str | None = None
    #: A tool message: the tool failed (its output is the error).
    is_error: bool = False
    #: An assistant message's reasoning parts, replayed to the provider that wrote them.
    reasoning: tuple[Reasoning, ...] = attrs.field(default=(), converter=_reasoning)
    #: A user message's attachments (references; the bytes are in the session's store).
    attachments: tuple[Attachment, ...] = attrs.field(default=(), converter=_attachments)


@attrs.frozen(kw_only=True)
class ToolSpec:
    """What the model is told about a tool: name, description and a JSON Schema object."""

    #: The tool's name, as the model calls it.
    name: str
    #: What the tool does, for the model.
    description: str = ""
    #: The JSON Schema object of its arguments (deeply frozen).
    parameters: Mapping[str, Any] = attrs.field(factory=FrozenDict, converter=_freeze_args,
                                                hash=False)


class MessageView(Sequence[Message]):
    """An immutable view of the first ``n`` messages of an append-only list.

    Taking a view costs O(1) whatever the session's length, which keeps a step's cost flat
    (issue 2, item 7). Two views of the same list and length are the same history by
    construction, which is how the C3 check stays O(1) on the normal path.
    """

    __slots__ = ("_items", "_n")

    def __init__(self, items: list[Message], n: int | None = None) -> None:
        self._items = items
        self._n = len(items) if n is None else n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return self._items[: self._n][index]
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("message index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        items = self._items
        for i in range(self._n):
            yield items[i]

    def same_as(self, other: object) -> bool:
        """True when ``other`` is a view of the same list and length (the O(1) check)."""
        return (
            isinstance(other, MessageView) and other._items is self._items and other._n == self._n
        )

    def __eq__(self, other: object) -> bool:
        if self.same_as(other):
            return True
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"MessageView({list(self)!r})"


@attrs.frozen(kw_only=True)
class ModelRequest:
    """Everything one provider call sends. Deeply immutable: the fields are frozen and so is
    everything inside them (options, tool schemas, tool-call arguments are
    :class:`FrozenDict`). A ``request`` wrapper that wants to change it swaps it on the
    :class:`dsh.llm.ModelCall` with ``attrs.evolve`` — and then the transport refuses to send
    it unless the change is in the ledger (MISSION C3, ``dsh.llm.transport``)."""

    #: The model id recorded on ``turn/start`` (the adapter's effective id).
    model: str
    #: The system prompt (the agent's ``system`` text and the plugins' fragments).
    system: str = ""
    #: The history the model reads: the ledger's projection (a read-only view).
    messages: Sequence[Message] = attrs.field(default=(), converter=_messages)
    #: The tools the model may call.
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_specs)
    #: Model options (temperature, max_tokens, …) as recorded on ``turn/start``.
    options: Mapping[str, Any] = attrs.field(factory=FrozenDict, converter=_freeze_args,
                                             hash=False)
    #: Stream the answer (only when someone observes the run).
    stream: bool = False


@attrs.frozen(kw_only=True)
class ModelResponse:
    """One resolved model answer. ``tool_call_source`` says how tool calls were found:
    ``native`` (the provider's own fields), a rescue format name, or ``None`` without calls."""

    #: The answer's text (with a rescued tool call taken out of it).
    text: str = ""
    #: The tool calls the model asked for.
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    #: Tokens of this request and answer.
    usage: Usage = Usage()
    #: The provider's reason for stopping (``stop``, ``tool_calls``, ``length``, …).
    stop_reason: str | None = None
    #: How the tool calls were found: ``native``, a rescue format's name, or None.
    tool_call_source: str | None = None
    #: The model that answered, as the provider names it (None when it does not say).
    model: str | None = None
    #: Reasoning parts the provider returned (recorded on ``assistant/message``).
    reasoning: tuple[Reasoning, ...] = attrs.field(default=(), converter=_reasoning)
