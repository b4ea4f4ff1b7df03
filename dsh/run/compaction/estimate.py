"""Knowing the budget: a model's context window and what the next request will carry.

* :func:`window_for` / :func:`agent_window` — a model's context window, from config, the
  adapter, a provider's error, or dsh's model data;
* :func:`estimate_tokens` / :func:`message_tokens` / :class:`ContextMeter` — a conservative
  token count of the next request, O(1) per step (the provider's own ``usage`` where the
  ledger has it, a documented over-estimate for what came after);
* :func:`calibrate` — the estimate corrected per session by the provider's own count of the
  prompts it was sent (``x/dsh.compaction/calibration``, so a resumed session counts alike).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from dsh.core.messages import Message

if TYPE_CHECKING:
    from dsh.ledger.history import Projection
    from dsh.ledger.store import Ledger
    from dsh.run.app import Agent


#: Numbers that providers put in their context-length errors (OpenAI, llama.cpp, vLLM,
#: llama-cpp-python): "maximum context length is 8192 tokens", "context window of 512".
_WINDOW_IN_ERROR = re.compile(
    r"(?:maximum context length is|context window of|context length of|n_ctx[ =:]+|"
    r"context size \(?|exceeds? the available context size \()\s*(\d{2,9})",
    re.IGNORECASE,
)


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


#: The calibration ratio (provider's prompt tokens / dsh's estimate) is kept within these.
MIN_RATIO = 0.25
MAX_RATIO = 4.0
#: A calibration is recorded again only when the ratio moves by more than this fraction.
RECALIBRATE = 0.05
#: The plugin event a calibration is recorded as (``x/dsh.compaction/calibration``).
PLUGIN = "dsh.compaction"
CALIBRATION = "calibration"


def ratio_of(reported: int, estimated: int) -> float:
    """``reported / estimated``, within :data:`MIN_RATIO` and :data:`MAX_RATIO`."""
    return min(MAX_RATIO, max(MIN_RATIO, reported / max(1, estimated)))


class ContextMeter:
    """How many tokens the next request will carry, O(1) per step.

    Where the ledger has a provider's ``usage``, the prompt up to that answer is known
    exactly (``input + output`` tokens of the last answer); only what came after it is
    estimated. Prefix sums of the estimates are extended as messages are appended, and
    rebuilt only when a compaction replaced the message list. Every estimate is scaled by
    ``ratio``, the session's calibration (1.0 until a provider reported a prompt's size).
    """

    def __init__(self, ratio: float = 1.0) -> None:
        self._list: list[Message] | None = None
        self._prefix: list[int] = [0]
        self._fixed_key: tuple[int, int] = (0, 0)
        self._fixed = 0
        #: The provider's count of a prompt over dsh's raw estimate of it (calibration).
        self.ratio = ratio
        #: True once ``ratio`` came from a provider's count (not the default guess).
        self.calibrated = False

    def scale(self, raw: int) -> int:
        """A raw estimate in the provider's tokens, rounded up (``ratio`` applied)."""
        return math.ceil(raw * self.ratio)

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
        """System prompt and tool schemas (raw): estimated again only when they change."""
        key = (id(proj.system), id(proj.tools))
        if key != self._fixed_key:
            tools = json.dumps([[t.name, t.description, dict(t.parameters)] for t in proj.tools],
                               ensure_ascii=False, default=str)
            self._fixed = estimate_tokens(proj.system) + estimate_tokens(tools)
            self._fixed_key = key
        return self._fixed

    def raw(self, proj: Projection) -> int:
        """The uncalibrated estimate of the next request (what a calibration compares)."""
        return self.fixed(proj) + self._extend(proj)[-1]

    def estimate(self, proj: Projection, messages: Sequence[Message] | None = None) -> int:
        """Estimated tokens of the projection's next request (or of one holding
        ``messages`` instead of its history), calibrated, ignoring any usage figures: the
        one measure compactions are compared by."""
        if messages is not None:
            return self.scale(self.fixed(proj) + sum(message_tokens(m) for m in messages))
        return self.scale(self.raw(proj))

    def used(self, proj: Projection) -> int:
        """Tokens of the next request: provider usage where known plus estimates after it."""
        prefix = self._extend(proj)
        anchor = proj.last_usage
        if anchor is not None and anchor[0] <= len(prefix) - 1:
            at, tokens = anchor
            return tokens + self.scale(prefix[-1] - prefix[at])
        return self.scale(self.fixed(proj) + prefix[-1])


def meter_of(ledger: Ledger) -> ContextMeter:
    """The session's meter (kept on the ledger object, so it lives as long as the session)."""
    meter = getattr(ledger, "_context_meter", None)
    if meter is None:
        from dsh.ledger import plugin_events

        meter = ContextMeter()
        known = plugin_events.read(ledger, PLUGIN, CALIBRATION)
        if len(known):  # a resumed session counts as it did (the latest calibration)
            data = known[-1].data
            meter.ratio = ratio_of(int(data["reported"]), int(data["estimated"]))
            meter.calibrated = True
        ledger._context_meter = meter  # type: ignore[attr-defined]
    return meter


def calibrate(ledger: Ledger, reported: int, estimated: int) -> bool:
    """The provider counted ``reported`` prompt tokens where dsh estimated ``estimated``
    (raw): correct the session's meter by their ratio, and record it (a plugin event of
    ``dsh.compaction``) when it moved by more than :data:`RECALIBRATE`, so a resumed session
    counts the same. True when recorded."""
    if reported <= 0 or estimated <= 0:
        return False
    meter = meter_of(ledger)
    ratio = ratio_of(reported, estimated)
    if meter.calibrated and abs(ratio - meter.ratio) <= meter.ratio * RECALIBRATE:
        return False
    from dsh.ledger import plugin_events

    plugin_events.record(ledger, PLUGIN, CALIBRATION,
                         {"reported": reported, "estimated": estimated})
    meter.ratio = ratio
    meter.calibrated = True
    return True


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
