"""Summarisation: the older part of the history summarised by a model, in recorded sub-runs
that each fit the window (issue 26).

The older part is rendered as text and cut into chunks that fit the summary model's window
together with the instructions, the summary so far and the answer's room (a hard
``max_tokens``). Each chunk is one sub-run of its own (its own ledger, linked to the session;
counted by the run's budgets) that folds the chunk into the running summary. A summary that
comes out no shorter than what it summarised is discarded: the strategy then proposes nothing
and the last resort (``truncate``) runs instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dsh.core.messages import Message
from dsh.run.compaction.estimate import estimate_tokens
from dsh.run.compaction.strategies import SUMMARY_CLOSE
from dsh.run.compaction.strategies import SUMMARY_OPEN
from dsh.run.compaction.strategies import SUMMARY_SYSTEM
from dsh.run.compaction.strategies import Compaction
from dsh.run.compaction.strategies import CompactionRequest
from dsh.run.compaction.strategies import split_point

#: A summary's answer may take at most this fraction of the window…
SUMMARY_FRACTION = 0.25
#: …and at most half of what it summarises, and never less than this many tokens.
MIN_SUMMARY_TOKENS = 24
#: At most this many chunks (sub-runs) per summary; the middle of a longer text is left out.
MAX_CHUNKS = 6
#: Framing tokens of a summary request besides its text (roles, template, slack).
REQUEST_OVERHEAD = 16
PROMPT = ("Summarise this conversation in at most {words} words.\n\n{previous}"
          "Conversation:\n{text}")
PREVIOUS = "The summary so far (fold it in):\n{summary}\n\n"


def summarize(request: CompactionRequest) -> Compaction | None:
    """Summarisation: a model writes a summary of the older part of the history (see the
    module's docstring). The summary replaces the older part as one user-role message;
    ``None`` when there is no older part or the summary would not be shorter."""
    from dsh.core.errors import ProviderError

    end = split_point(request)
    if end == 0:
        return None
    older = list(request.messages)[:end]
    try:
        summary, session_id = write_summary(request, older)
    except ProviderError as exc:
        from dsh.run.compaction.trigger import is_context_error

        if is_context_error(exc):  # the summary request itself did not fit: truncate instead
            return None
        raise
    if not summary.strip():
        return None
    text = f"{SUMMARY_OPEN}\n{summary.strip()}\n{SUMMARY_CLOSE}"
    replacement = (Message(role="user", content=text),)
    if request.estimate(replacement) >= request.estimate(older):
        return None  # a summary no shorter than what it replaces is no compaction
    return Compaction(start=0, end=end, replacement=replacement, strategy="summarize",
                      summary_session=session_id)


def summary_limit(request: CompactionRequest, text: str) -> int:
    """The summary's hard ``max_tokens``: a quarter of the window, half of its input, and
    not under :data:`MIN_SUMMARY_TOKENS`."""
    half = request.scale(estimate_tokens(text)) // 2
    if request.window:
        half = min(half, int(request.window * SUMMARY_FRACTION))
    return max(MIN_SUMMARY_TOKENS, half)


def room(request: CompactionRequest, limit: int, summary: str) -> int:
    """How many raw estimate tokens of conversation one summary request can carry: the
    window less the answer's room (``limit``), the instructions, the running ``summary`` and
    :data:`REQUEST_OVERHEAD`, in the session's calibration. Unbounded (the whole text) when
    the window is unknown; 0 when not even the instructions fit."""
    if not request.window:
        return 1 << 62
    fixed = estimate_tokens(SUMMARY_SYSTEM + PROMPT + PREVIOUS + summary) + REQUEST_OVERHEAD
    left = request.window - limit - request.scale(fixed)
    return max(0, int(left / request.ratio))


def cut(text: str, budget: int) -> int:
    """Where to end a piece of ``text`` whose estimate fits ``budget`` raw tokens: at a line
    end when one is in its second half. 0 when not even one character fits."""
    end = min(len(text), budget * 3)
    while end > 0 and estimate_tokens(text[:end]) > budget:
        end = end * 3 // 4
    if end < len(text):
        nl = text.rfind("\n", end // 2, end)
        if nl > 0:
            end = nl + 1
    return end


def write_summary(request: CompactionRequest, older: Sequence[Message]) -> tuple[str, str]:
    """Ask the agent's summary model (``summary_model``, else its own model) for a summary
    of ``older``, a piece at a time, each piece as much as one request can carry with the
    summary so far (:func:`room`), in a nested run with its own ledger and a hard
    ``max_tokens``; return ``(summary, session id of the last sub-run)``. A text that would
    take more than :data:`MAX_CHUNKS` requests loses its middle (marked ``[...]``). The
    summary is ``""`` when a piece's summary came out no shorter than its input (discarded)
    or the window cannot hold a summary request."""
    from dsh.ledger.history import render_history

    text = render_history(older)
    limit = summary_limit(request, text)
    first = room(request, limit, "")
    if first <= 0:
        return "", ""
    # A later request also carries the summary so far (at most ``limit`` tokens); where the
    # window has no room for that, one request summarises the beginning and the end.
    later = max(0, room(request, limit, "x" * limit * 3) - 8) * (MAX_CHUNKS - 1)
    if estimate_tokens(text) > first + later:
        keep = first + later
        head = cut(text, keep // 2)
        tail = len(text) - cut(text[::-1], keep - keep // 2 - 4)
        text = text[:head] + "[...]\n" + text[max(head, tail):]
    summary, session_id = "", ""
    while text:
        end = cut(text, room(request, limit, summary))
        if end <= 0:  # the summary so far leaves no room for the rest: not a summary of all
            return "", session_id
        piece, text = text[:end], text[end:]
        previous = PREVIOUS.format(summary=summary) if summary else ""
        prompt = PROMPT.format(words=max(8, limit * 3 // 5), previous=previous, text=piece)
        out, session_id = _sub_run(request, prompt, limit)
        if estimate_tokens(out) >= estimate_tokens(piece) + estimate_tokens(summary):
            return "", session_id  # longer than its input: discarded
        summary = out.strip()
    return summary, session_id


def _sub_run(request: CompactionRequest, prompt: str, limit: int) -> tuple[str, str]:
    from dsh.core.errors import ProviderError

    agent = request.agent
    app = agent.app
    model = getattr(agent, "summary_model", None) or agent.model_id
    key = "max_output_tokens" if str(model).startswith("openai-responses:") else "max_tokens"
    sub = app.agent(agent.name, model=model, system=SUMMARY_SYSTEM, tools=[],
                    compaction="off", options={key: limit})
    ctx: Any = request.ctx
    if ctx is None and request.ledger is not None:
        # By hand (`dsh sessions compact`): no run, but the sub-run is still the session's
        # child, linked to it (and so never taken for the agent's latest session).
        from dsh.host.runcontext import RunContext

        ctx = RunContext(run_id="compact", agent_name=agent.name, ledger=request.ledger)
    with app.open_session(sub) as session:
        result = session.send(prompt, parent=ctx, cancel=ctx.cancel if ctx else None)
    if result.outcome != "completed" or not result.output.strip():
        raise ProviderError(f"compaction: the summary run {result.session_id} ended with "
                            f"{result.outcome}: {result.reason or 'no summary'}")
    return result.output, result.session_id
