"""Context compaction: a long session keeps fitting its model's window (issue 10, MISSION C4).

The model's memory is the projection of the ledger, so compaction is one more recorded event:
``context/compacted`` says which range of the projected messages was replaced by which
messages, by which strategy and plugin. The projection applies it; the original events stay
in the ledger (nothing is deleted), a resumed session projects exactly the same history, and
the C3 check covers the result like everything else.

This module holds the pieces that do not need a run:

* :func:`window_for` — a model's context window, from config, the adapter or a table;
* :func:`estimate_tokens` / :class:`ContextMeter` — a conservative token count of what the
  next request will carry, O(1) per step (the provider's own ``usage`` where the ledger has
  it, a documented over-estimate for what came after);
* the ``compact_context`` hook's built-in implementation and its strategies, *observation
  masking* (old tool outputs replaced by a placeholder, no model call) and *summarisation*
  (the older part summarised by a model in a recorded sub-run).

When compaction runs (before a request, on a provider's context-length error, by hand) is
decided by :func:`maybe_compact` and :func:`compact_now`, called by the loop and the CLI.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

import attrs

from dsh.core.messages import Message
from dsh.hookspecs import hookimpl

if TYPE_CHECKING:
    from dsh.host.runcontext import RunContext
    from dsh.host.scope import AgentHandle
    from dsh.ledger.history import Projection
    from dsh.ledger.store import Ledger
    from dsh.run.app import Agent

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


#: Numbers that providers put in their context-length errors (OpenAI, llama.cpp, vLLM,
#: llama-cpp-python): "maximum context length is 8192 tokens", "context window of 512".
_WINDOW_IN_ERROR = re.compile(
    r"(?:maximum context length is|context window of|context length of|n_ctx[ =:]+|"
    r"context size \(?|exceeds? the available context size \()\s*(\d{2,9})",
    re.IGNORECASE,
)


# -- knowing the budget ------------------------------------------------------------------------


def window_from_table(model_name: str) -> int | None:
    """The window of ``model_name`` (``gpt-4o-mini``, ``openai:gpt-4o``…) from dsh's model
    data file (:func:`dsh.core.modeldata.lookup`: the longest matching id, after any ``adapter:``
    and ``vendor/`` part), read only now, when nothing else gave a window."""
    from dsh.core.modeldata import window

    return window(model_name)


def window_in_error(message: str) -> int | None:
    """The window size a provider's context-length error states, if it states one."""
    m = _WINDOW_IN_ERROR.search(message)
    return int(m.group(1)) if m else None


def window_for(agent: Agent) -> int | None:
    """``agent``'s context window in tokens, or ``None`` when nothing says.

    In order: the agent's ``context_window`` setting, the model's (``[models.ID]
    context_window``), what the adapter reports (``Model.context_window``, e.g. a local
    model's ``n_ctx``, or a size learnt from an earlier context-length error), the model
    data file (:mod:`dsh.modeldata`).
    """
    explicit = getattr(agent, "context_window", None)
    if explicit:
        return int(explicit)
    settings = agent.app.config.models.get(agent.model_id, {})
    if settings.get("context_window"):
        return int(settings["context_window"])
    model = agent.model
    reported = getattr(model, "context_window", None)
    if callable(reported):
        reported = reported()
    if reported:
        return int(reported)
    return window_from_table(str(settings.get("model") or agent.model_id))


def estimate_tokens(text: str) -> int:
    """A conservative (high) token count for ``text``, without a tokenizer.

    One token per 3 ASCII characters (English averages about 4 with the common BPE
    vocabularies) and one per other character (CJK runs near one per character, accented
    Latin below). Over-estimating compacts a little early; under-estimating would send
    requests the provider rejects. Counted at C speed (no loop over characters).
    """
    if not text:
        return 0
    n = len(text)
    if text.isascii():
        return n // 3 + 1
    ascii_chars = len(text.encode("ascii", "ignore"))
    return ascii_chars // 3 + (n - ascii_chars) + 1


#: Per-message framing tokens (role, separators) added by chat templates.
MESSAGE_OVERHEAD = 4


def message_tokens(m: Message) -> int:
    n = MESSAGE_OVERHEAD + estimate_tokens(m.content)
    for c in m.tool_calls:
        n += estimate_tokens(c.name) + estimate_tokens(json.dumps(c.arguments, ensure_ascii=False))
    return n


class ContextMeter:
    """How many tokens the next request will carry, O(1) per step.

    Where the ledger has a provider's ``usage``, the prompt up to that answer is known
    exactly (``input + output`` tokens of the last answer); only what came after it is
    estimated. Prefix sums of the estimates are extended as messages are appended, and
    rebuilt only when a compaction replaced the message list.
    """

    def __init__(self) -> None:
        self._list: list[Message] | None = None
        self._prefix: list[int] = [0]
        self._fixed_key: tuple[int, int] = (0, 0)
        self._fixed = 0

    def _extend(self, proj: Projection) -> list[int]:
        items = proj._messages
        if items is not self._list:
            self._list, self._prefix = items, [0]
        prefix = self._prefix
        total = prefix[-1]
        for i in range(len(prefix) - 1, len(items)):
            total += message_tokens(items[i])
            prefix.append(total)
        return prefix

    def fixed(self, proj: Projection) -> int:
        """System prompt and tool schemas: estimated again only when they change."""
        key = (id(proj.system), id(proj.tools))
        if key != self._fixed_key:
            tools = json.dumps([[t.name, t.description, dict(t.parameters)] for t in proj.tools],
                               ensure_ascii=False, default=str)
            self._fixed = estimate_tokens(proj.system) + estimate_tokens(tools)
            self._fixed_key = key
        return self._fixed

    def estimate(self, proj: Projection, messages: Sequence[Message] | None = None) -> int:
        """Estimated tokens of the projection's next request, ignoring any usage figures."""
        if messages is not None:
            return self.fixed(proj) + sum(message_tokens(m) for m in messages)
        return self.fixed(proj) + self._extend(proj)[-1]

    def used(self, proj: Projection) -> int:
        """Tokens of the next request: provider usage where known plus estimates after it."""
        prefix = self._extend(proj)
        anchor = proj.last_usage
        if anchor is not None and anchor[0] <= len(prefix) - 1:
            at, tokens = anchor
            return tokens + prefix[-1] - prefix[at]
        return self.fixed(proj) + prefix[-1]


# -- the compaction record ---------------------------------------------------------------------


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


# -- when: before a request, after a context-length error, by hand ---------------------------


def is_context_error(exc: BaseException) -> bool:
    """True for a provider's "the prompt is longer than my context window" error, as the
    adapters report it (OpenAI-compatible, Anthropic, llama.cpp, the local model)."""
    from dsh.core.errors import ProviderError

    if not isinstance(exc, ProviderError):
        return False
    if getattr(exc, "context_overflow", False):
        return True
    text = str(exc).lower()
    return "context too long" in text or "exceed context window" in text


def meter_of(ledger: Ledger) -> ContextMeter:
    """The session's meter (kept on the ledger object, so it lives as long as the session)."""
    meter = getattr(ledger, "_context_meter", None)
    if meter is None:
        meter = ContextMeter()
        ledger._context_meter = meter  # type: ignore[attr-defined]
    return meter


def agent_window(agent: Agent) -> int | None:
    """:func:`window_for`, memoised on the agent (a size learnt from an error wins)."""
    learnt = getattr(agent, "_learnt_window", None)
    if learnt:
        return int(learnt)
    cached = getattr(agent, "_window", False)
    if cached is False:
        cached = window_for(agent)
        agent._window = cached  # type: ignore[attr-defined]
    return cached


def context_status(agent: Agent, ledger: Ledger) -> dict[str, Any]:
    """``{"used": tokens, "window": tokens or None, "compactions": n}`` for reports."""
    proj = ledger.projection
    try:
        window = agent_window(agent)
    except Exception:  # noqa: BLE001 - a report never fails on an adapter's opinion
        window = None
    return {"used": meter_of(ledger).used(proj), "window": window,
            "compactions": proj.compactions}


def maybe_compact(agent: Agent, ledger: Ledger, ctx: RunContext | None) -> None:
    """Before a request: compact when the next request would pass ``compact_at`` of the
    window. One comparison per step when nothing is due."""
    if agent.compaction == "off":
        return
    window = agent_window(agent)
    if not window:
        return
    used = meter_of(ledger).used(ledger.projection)
    if used <= window * agent.compact_at:
        return
    compact_now(agent, ledger, ctx, reason="threshold")


def compact_now(agent: Agent, ledger: Ledger, ctx: RunContext | None, *, reason: str,
                strategy: str | None = None) -> Any:
    """Ask the ``compact_context`` hook for a compaction, record it, and return the event
    (``None`` when no strategy proposed one). Then, if the history still does not fit the
    window, leave the oversized message(s) out of the model's history (recorded too) and
    raise a clear :class:`~dsh.core.errors.ProviderError`."""
    from dsh.core.errors import PluginError

    proj = ledger.projection
    meter = meter_of(ledger)
    window = agent_window(agent)
    used = meter.used(proj)
    target = int(window * TARGET_FRACTION) if window else max(1, used // 2)
    request = CompactionRequest(
        agent=agent, messages=proj.view(), window=window, used=used, target=target,
        reason=reason, strategy=strategy or agent.compaction, projection=proj, ctx=ctx,
        meter=meter, ledger=ledger)
    result, plugin = call_compact_context(agent.pm, request)
    event = None
    if result is not None:
        if not isinstance(result, Compaction) or not (
            0 <= result.start <= result.end <= len(proj)
            and all(isinstance(m, Message) for m in result.replacement)
        ):
            raise PluginError(
                f"plugin {plugin} returned an invalid compaction from compact_context "
                f"(a Compaction with 0 <= start <= end <= {len(proj)} and Message items "
                f"expected, got {result!r:.200})", plugin=plugin, hook="compact_context")
        event = _record(ledger, result, plugin, reason, used)
    if window:
        after = meter.used(proj)
        if after > window and (reason != "threshold" or _hopeless(proj, window)):
            _drop_oversized(agent, ledger, window, after)
    return event


def _hopeless(proj: Projection, window: int) -> bool:
    """Before a request, dsh's count is an over-estimate unless the provider's usage anchors
    it: the request is sent anyway (the provider has the last word, and its context-length
    error compacts and retries) unless some message alone cannot fit even at an optimistic
    4 characters per token."""
    return any(message_tokens(m) * 3 // 4 > window for m in proj.view())


def call_compact_context(pm: Any, request: CompactionRequest) -> tuple[Any, str]:
    """Call ``compact_context`` as pluggy would (``wrapper=True`` implementations around the
    plain ones, which are asked in pluggy's order until one answers), keeping provenance: the
    plugin whose implementation returned the result, or the wrapper that replaced it. Recorded
    from the registration, never from what a plugin says of itself."""
    from dsh.core.errors import PluginError
    from dsh.host.manager import call_impl

    hook = "compact_context"
    order = list(reversed(pm.hook.compact_context.get_hookimpls()))
    for impl in order:
        if impl.hookwrapper:
            raise PluginError(f"plugin {impl.plugin_name}: old-style hookwrapper on {hook}; "
                              "use @hookimpl(wrapper=True)", plugin=impl.plugin_name, hook=hook)
    wrappers = []
    for impl in (i for i in order if i.wrapper):
        gen = call_impl(impl, hook, request=request)
        try:
            next(gen)
        except StopIteration:
            raise PluginError(f"plugin {impl.plugin_name}: its {hook} wrapper did not yield",
                              plugin=impl.plugin_name, hook=hook) from None
        wrappers.append((impl, gen))
    result: Any = None
    who = ""
    failure: BaseException | None = None
    try:
        for impl in (i for i in order if not i.wrapper):
            answer = call_impl(impl, hook, request=request)
            if answer is not None:
                result, who = answer, impl.plugin_name
                break
    except BaseException as exc:  # noqa: BLE001 - handed to the wrappers, as pluggy does
        failure = exc
    for impl, gen in reversed(wrappers):
        try:
            if failure is not None:
                gen.throw(failure)
            else:
                gen.send(result)
        except StopIteration as stop:
            failure = None
            if stop.value is not result:
                result, who = stop.value, impl.plugin_name
            continue
        except BaseException as exc:  # noqa: BLE001
            failure = exc
            continue
        failure = PluginError(f"plugin {impl.plugin_name}: its {hook} wrapper yielded twice",
                              plugin=impl.plugin_name, hook=hook)
    if failure is not None:
        raise failure
    return result, who


def _record(ledger: Ledger, c: Compaction, plugin: str, reason: str, before: int) -> Any:
    from dsh.ledger.events import ContextCompacted

    proj = ledger.projection
    meter = meter_of(ledger)
    after = meter.estimate(proj, apply(proj.view(), c))
    return ledger.append(
        ContextCompacted, start=c.start, end=c.end, messages=c.replacement,
        strategy=c.strategy, plugin=plugin, reason=reason, tokens_before=before,
        tokens_after=after, summary_session=c.summary_session)


def _drop_oversized(agent: Agent, ledger: Ledger, window: int, used: int) -> None:
    """Nothing brought the history under the window: some message alone is too large. Leave
    the largest messages out of the model's history (a recorded compaction, so the session
    stays usable for the next, smaller message) and fail the turn with a clear error."""
    from dsh.core.errors import ProviderError

    proj = ledger.projection
    msgs = list(proj.view())
    sizes = sorted(((message_tokens(m), i) for i, m in enumerate(msgs)), reverse=True)
    dropped: list[int] = []
    excess = used - int(window * TARGET_FRACTION)
    for size, i in sizes:
        if excess <= 0 or size <= window * TARGET_FRACTION:
            break
        dropped.append(i)
        excess -= size
    if not dropped:
        raise ProviderError(
            f"context too long: the session's history (about {used} tokens) could not be "
            f"brought under the model's context window ({window} tokens) by compaction "
            f"{agent.compaction!r}; try `dsh sessions compact ID --strategy summarize`")
    largest = sizes[0][0]
    start, end = min(dropped), max(dropped) + 1
    picked = set(dropped)
    replacement = tuple(
        attrs.evolve(m, content=f"[message left out: about {message_tokens(m)} tokens, larger "
                                f"than the model's context window of {window}]")
        if i in picked else m
        for i, m in enumerate(msgs[start:end], start))
    _record(ledger, Compaction(start=start, end=end, replacement=replacement,
                               strategy="drop-oversized"), "dsh.compaction", "oversized", used)
    raise ProviderError(
        f"context too long: a message of about {largest} tokens is too large for the model's "
        f"context window ({window} tokens) with the rest of the conversation, even after "
        "compaction; it was left out of the model's history, so the session can go on with "
        "a smaller message")


def learn_window(agent: Agent, exc: BaseException) -> None:
    """Remember the window a provider's context-length error stated, or, when it stated
    none, the one the server reports where it can be asked (``probe_context_window``, e.g.
    llama.cpp's ``/props``). Later requests of the process then compact before they fail."""
    size = window_in_error(str(exc))
    if not size:
        probe = getattr(agent.model, "probe_context_window", None)
        size = probe() if callable(probe) else None
    if size:
        agent._learnt_window = size  # type: ignore[attr-defined]


def compact_session(app: Any, session_id: str, *, strategy: str | None = None,
                    agent: str | None = None) -> Any:
    """Compact a stored session now (``dsh sessions compact``): the ``compact_context``
    hook is asked with reason ``manual``; the event is returned (``None`` when no strategy
    proposed anything). The session's lock is held meanwhile, as for a run. A summary made
    here is a run of its own (with its own ledger), outside any budget but the config's."""
    name = agent or app.store.info(session_id).agent or None
    assembled = app.agent(name)
    with app.open_session(assembled, session_id) as session:
        return compact_now(assembled, session.ledger, None, reason="manual",
                           strategy=strategy)
