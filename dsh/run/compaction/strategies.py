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
STRATEGIES = ("auto", "mask", "summarize", "off")
DEFAULT_STRATEGY = "auto"
#: Compact automatically before a request estimated above this fraction of the window.
DEFAULT_THRESHOLD = 0.8
#: After compacting, aim for at most this fraction of the window.
TARGET_FRACTION = 0.5
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

    @property
    def handle(self) -> AgentHandle:
        """The :class:`dsh.AgentHandle` of the agent: settings, stashes, plugin events
        (``session_stash`` only inside a run: not under ``dsh sessions compact``)."""
        handle: AgentHandle = self.agent.info
        return handle

    def estimate(self, messages: Sequence[Message]) -> int:
        """A conservative token count of ``messages`` with the request's system prompt and
        tools, as the meter counts them."""
        meter = self.meter or ContextMeter()
        return meter.estimate(self.projection, messages)


@hookimpl(trylast=True)
def compact_context(request: CompactionRequest) -> Compaction | None:
    """The built-in strategies: ``mask``, ``summarize``, and ``auto`` (mask, then summarise
    if masking alone does not reach the target)."""
    strategy = request.strategy
    if strategy == "mask":
        return mask_observations(request)
    if strategy == "summarize":
        return summarize(request)
    if strategy == "auto":
        masked = mask_observations(request)
        if masked is not None:
            after = apply(request.messages, masked)
            if request.estimate(after) <= request.target:
                return masked
        return summarize(request) or mask_observations(request, keep=0)
    return None


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
    chosen: list[int] = []
    for i in candidates:
        chosen.append(i)
        m = msgs[i]
        masked = MASK.format(name=m.name or "tool", chars=len(m.content))
        excess -= message_tokens(m) - message_tokens(attrs.evolve(m, content=masked))
        if excess <= 0:
            break
    start, end = chosen[0], chosen[-1] + 1
    picked = set(chosen)
    replacement = tuple(
        attrs.evolve(m, content=MASK.format(name=m.name or "tool", chars=len(m.content)))
        if i in picked else m
        for i, m in enumerate(msgs[start:end], start)
    )
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


def summarize(request: CompactionRequest) -> Compaction | None:
    """Summarisation: a model writes a summary of the older part of the history, in a
    recorded sub-run of its own (its ledger is linked from the event), counted by the run's
    budgets. The summary replaces the older part as one user-role message."""
    end = split_point(request)
    if end == 0:
        return None
    older = list(request.messages)[:end]
    summary, session_id = write_summary(request, older)
    text = f"{SUMMARY_OPEN}\n{summary.strip()}\n{SUMMARY_CLOSE}"
    replacement = (Message(role="user", content=text),)
    if request.estimate(replacement) >= request.estimate(older):
        return None  # a summary no shorter than what it replaces is no compaction
    return Compaction(start=0, end=end, replacement=replacement, strategy="summarize",
                      summary_session=session_id)


def write_summary(request: CompactionRequest, older: Sequence[Message]) -> tuple[str, str]:
    """Ask the agent's summary model (``summary_model``, else its own model) for a summary
    of ``older`` in a nested run with its own ledger; return ``(summary, session id)``."""
    from dsh.core.errors import ProviderError
    from dsh.ledger.history import render_history

    agent = request.agent
    app = agent.app
    model = getattr(agent, "summary_model", None) or agent.model_id
    sub = app.agent(agent.name, model=model, system=SUMMARY_SYSTEM, tools=[],
                    compaction="off")
    text = render_history(older)
    window = request.window
    if window:
        # Leave room for the summary itself: the input may take about 60% of the window.
        limit = int(window * 0.6) * 3
        if len(text) > limit:
            text = "[...]\n" + text[-limit:]
    prompt = f"Summarise this conversation:\n\n{text}"
    ctx = request.ctx
    if ctx is None and request.ledger is not None:
        # By hand (`dsh sessions compact`): no run, but the sub-run is still the session's
        # child, linked to it (and so never taken for the agent's latest session).
        from dsh.host.runcontext import RunContext

        ctx = RunContext(run_id="compact", agent=agent.name, ledger=request.ledger)
    with app.open_session(sub) as session:
        result = session.send(prompt, parent=ctx, cancel=ctx.cancel if ctx else None)
    if result.outcome != "completed" or not result.output.strip():
        raise ProviderError(f"compaction: the summary run {result.session_id} ended with "
                            f"{result.outcome}: {result.reason or 'no summary'}")
    return result.output, result.session_id
