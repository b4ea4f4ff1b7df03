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


def _freeze_args(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(value or {})


def _calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    return tuple(value)


def _specs(value: Iterable[ToolSpec]) -> tuple[ToolSpec, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class ToolCall:
    """One call the model asked for. ``arguments`` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict, converter=_freeze_args, hash=False)


@attrs.frozen(kw_only=True)
class Usage:
    """Token counts of one model response (zero when the provider reports none)."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


@attrs.frozen(kw_only=True)
class Message:
    """One entry of the model's history.

    ``role`` is ``"user"``, ``"assistant"`` or ``"tool"`` (the system prompt travels separately
    on the request). A tool message carries ``tool_call_id`` and ``name``; ``is_error`` marks a
    failed tool result.
    """

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False


@attrs.frozen(kw_only=True)
class ToolSpec:
    """What the model is told about a tool: name, description and a JSON Schema object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = attrs.field(factory=dict, hash=False)


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
    """Everything one provider call sends. Frozen: a ``request`` wrapper that wants to change it
    swaps it on the :class:`dsh.llm.ModelCall` with ``attrs.evolve``."""

    model: str
    system: str = ""
    messages: Sequence[Message] = ()
    tools: tuple[ToolSpec, ...] = attrs.field(default=(), converter=_specs)
    options: dict[str, Any] = attrs.field(factory=dict, hash=False)
    stream: bool = False


@attrs.frozen(kw_only=True)
class ModelResponse:
    """One resolved model answer. ``tool_call_source`` says how tool calls were found:
    ``native`` (the provider's own fields), a rescue format name, or ``None`` without calls."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_calls)
    usage: Usage = Usage()
    stop_reason: str | None = None
    tool_call_source: str | None = None
    model: str | None = None
