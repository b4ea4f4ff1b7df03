"""The compaction record and the built-in strategies of the ``compact_context`` hook:
*observation masking* (old tool outputs replaced by a placeholder, no model call) and
*summarisation* (the older part summarised by a model in a recorded sub-run).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.messages import Message
from dsh.hookspecs import hookimpl
from dsh.run.compaction.estimate import ContextMeter
from dsh.run.compaction.estimate import message_tokens

if TYPE_CHECKING:
    from dsh.host.scope import AgentHandle


#: Strategies the built-in ``compact_context`` implementation knows.
STRATEGIES = ("auto", "mask", "summarize", "truncate", "off")
DEFAULT_STRATEGY = "auto"
#: Compact automatically before a request estimated above this fraction of the window.
DEFAULT_THRESHOLD = 0.8
#: After compacting, aim for at most this fraction of the window.
TARGET_FRACTION = 0.5
#: What stands for the exchanges the last resort (``truncate``) left out.
TRUNCATED = "[{n} earlier messages left out to fit the context window]"
#: How a masked tool output reads to the model.
MASK = "[output of {name} omitted to save context ({chars} characters); ask again if needed]"
#: Marks the message a summary replaces an older part with.
SUMMARY_OPEN = "<summary of the earlier conversation>"
SUMMARY_CLOSE = "</summary>"
SUMMARY_SYSTEM = (
    "You summarise a conversation between a user and an AI assistant so that the assistant "
    "can continue it without the original. Keep every fact, decision, name, number, file "
    "path, open question and instruction the user gave; drop pleasantries. Write plain prose "
    "or short bullet points, no preamble."
)


def _messages(items: Any) -> tuple[Message, ...]:
    return tuple(items)


@attrs.frozen(kw_only=True)
class Compaction:
    """What a strategy proposes: replace ``messages[start:end]`` of the projection by
    ``replacement``. Recorded as a ``context/compacted`` event before it takes effect."""

    #: The first message replaced (an index into the projected history).
    start: int
    #: One past the last message replaced.
    end: int
    #: What the model reads instead of ``messages[start:end]``.
    replacement: tuple[Message, ...] = attrs.field(converter=_messages)
    #: The strategy that proposed it (``mask``, ``summarize``, a plugin's name).
    strategy: str
    #: The sub-run that wrote a summary (its session id), when a model was asked.
    summary_session: str | None = None


@attrs.define(eq=False)
class CompactionRequest:
    """The envelope of one ``compact_context`` call (mutable, like ``ModelCall``)."""

    #: The :class:`dsh.run.app.Agent` whose session is compacted (``handle`` is its handle).
    agent: Any
    #: The projected history (a read-only view).
    messages: Sequence[Message]
    #: The model's context window in tokens (``None`` when unknown).
    window: int | None
    #: The tokens the next request would carry.
    used: int
    #: Compact to at most this many tokens.
    target: int
    #: ``threshold`` (before a request), ``provider`` (after a context-length error),
    #: ``manual`` (``dsh sessions compact``) or ``oversized``.
    reason: str
    #: The agent's configured strategy (``auto``, ``mask``, ``summarize``, or a name a
    #: plugin knows).
    strategy: str
    #: The session's :class:`dsh.ledger.history.Projection` (what ``messages`` was taken from).
    projection: Any = None
    #: The run's :class:`dsh.RunContext`, or None under ``dsh sessions compact``.
    ctx: Any = None
    #: The session's token meter (what :meth:`estimate` counts with).
    meter: ContextMeter | None = None
    #: The session's ledger (its id links a summary's sub-run back to it).
    ledger: Any = None
    #: Tokens the request must leave free for the answer (its ``max_tokens`` option).
    reserve: int = 0

    @property
    def handle(self) -> AgentHandle:
        """The :class:`dsh.AgentHandle` of the agent: settings, stashes, plugin events
        (``session_stash`` only inside a run: not under ``dsh sessions compact``)."""
        handle: AgentHandle = self.agent.info
        return handle

    @property
    def ratio(self) -> float:
        """The session's calibration (:class:`ContextMeter`'s ``ratio``; 1.0 without one)."""
        return self.meter.ratio if self.meter else 1.0

    def scale(self, raw: int) -> int:
        """A raw estimate (:func:`message_tokens`) in the meter's calibrated tokens."""
        return self.meter.scale(raw) if self.meter else raw

    def estimate(self, messages: Sequence[Message]) -> int:
        """A conservative token count of ``messages`` with the request's system prompt and
        tools, as the meter counts them."""
        meter = self.meter or ContextMeter()
        return meter.estimate(self.projection, messages)


def choose(request: CompactionRequest) -> Compaction | None:
    """The built-in strategies: ``mask``, ``summarize``, ``truncate``, and ``auto`` (mask,
    then summarise if masking alone does not reach the target). Whatever a strategy leaves
    over the window, :func:`dsh.run.compaction.trigger.compact_now` truncates (the last
    resort), so a strategy may come short of the target."""
    from dsh.run.compaction.summary import summarize

    strategy = request.strategy
    if strategy == "mask":
        return mask_observations(request)
    if strategy == "summarize":
        return summarize(request)
    if strategy == "truncate":
        return truncate(request)
    if strategy == "auto":
        masked = mask_observations(request)
        if masked is not None:
            after = apply(request.messages, masked)
            if request.estimate(after) <= request.target:
                return masked
        return summarize(request) or mask_observations(request, keep=0)
    return None


#: The built-in ``compact_context`` implementation (``trylast``): :func:`choose`, marked
#: rather than decorated so that the mutation tester, which skips decorated functions,
#: mutates the strategy chooser too (docs/testing.md).
compact_context = hookimpl(trylast=True)(choose)


def apply(messages: Sequence[Message], c: Compaction) -> list[Message]:
    """``messages`` with ``c`` applied (what the projection does with the event)."""
    items = list(messages)
    return items[: c.start] + list(c.replacement) + items[c.end:]


def _is_masked(m: Message) -> bool:
    return m.role == "tool" and m.content.startswith("[output of ") and "omitted" in m.content


def mask_observations(request: CompactionRequest, keep: int = 2) -> Compaction | None:
    """Observation masking: replace old tool outputs with a short placeholder, oldest first,
    until the estimate is under the target; the last ``keep`` tool results stay. The model's
    reasoning and its calls stay as they were, so the history keeps its shape (every call
    still has its result). Costs no model call. ``None`` when nothing can be masked."""
    msgs = list(request.messages)
    tools = [i for i, m in enumerate(msgs) if m.role == "tool" and not _is_masked(m)]
    candidates = tools[: max(0, len(tools) - keep)]
    if not candidates:
        return None
    excess = request.used - request.target
    chosen: dict[int, Message] = {}
    for i in candidates:
        m = msgs[i]
        chosen[i] = masked = attrs.evolve(m, content=MASK.format(name=m.name or "tool",
                                                                  chars=len(m.content)))
        excess -= request.scale(message_tokens(m) - message_tokens(masked))
        if excess <= 0:
            break
    start, end = candidates[0], max(chosen) + 1
    replacement = tuple(chosen.get(i, m) for i, m in enumerate(msgs[start:end], start))
    return Compaction(start=start, end=end, replacement=replacement, strategy="mask")


def split_point(request: CompactionRequest) -> int:
    """Where the kept, most recent part of the history starts for a summary: at a step
    boundary (a user message, or an assistant message after a complete step), so no tool
    result is separated from its call; as early as half the target allows, but always
    leaving the latest step. 0 when there is no older part to summarise."""
    msgs = list(request.messages)
    starts = [i for i, m in enumerate(msgs) if i > 0 and (
        m.role == "user" or (m.role == "assistant" and msgs[i - 1].role != "assistant"))]
    if not starts:
        return 0
    budget = max(0, request.target // 2)
    # The latest start is always allowed; earlier ones while the kept part fits the budget.
    best = starts[-1]
    for i in reversed(starts[:-1]):
        if request.estimate(msgs[i:]) - request.estimate(()) > budget:
            break
        best = i
    return best


def truncate(request: CompactionRequest) -> Compaction | None:
    """The last resort: leave out the oldest whole exchanges until the estimate is under the
    target. An exchange unit is a message with the tool results that follow it, so a call is
    never separated from its result; the newest user message and the latest unit are always
    kept (the system prompt is not in the history). The units left out become one note
    (:data:`TRUNCATED`), so the model knows something is missing; the recorded range says
    what. ``None`` when nothing can be left out."""
    msgs = list(request.messages)
    starts = [i for i, m in enumerate(msgs) if i == 0 or m.role != "tool"]
    if len(starts) < 2:
        return None
    bounds = [*starts, len(msgs)]
    units = list(zip(bounds, bounds[1:], strict=False))
    newest = max((i for i in starts if msgs[i].role == "user"), default=-1)
    kept = {newest, starts[-1]}
    droppable = [u for u in units if u[0] not in kept]
    if not droppable:
        return None
    best: Compaction | None = None
    dropped = 0
    for k, (unit_start, unit_end) in enumerate(droppable, 1):
        dropped += unit_end - unit_start
        keep = [m for s, e in units[:units.index(droppable[k - 1]) + 1] if s in kept
                for m in msgs[s:e]]
        note = Message(role="user", content=TRUNCATED.format(n=dropped))
        best = Compaction(start=0, end=unit_end, replacement=(note, *keep),
                          strategy="truncate")
        if request.estimate(apply(msgs, best)) <= request.target:
            break
    whole = request.estimate(msgs)
    if best is not None and request.estimate(apply(msgs, best)) >= whole \
            and [*best.replacement[1:], *msgs[best.end:]][0].role == "user":
        # The note would outweigh what it stands for (an earlier note, say): without it.
        best = attrs.evolve(best, replacement=best.replacement[1:])
    if best is None or request.estimate(apply(msgs, best)) >= whole:
        return None
    return best
