"""What ``dsh sessions show`` (:mod:`dsh.cli.render`) and the HTML page
(:mod:`dsh.cli.export_html`) say alike about a session: counts with their plural, the note
under a cut text, a readable line for the plugin events dsh knows, and which tool calls never
started.

A call the model asked for can be closed without ever starting: the budget ran out after the
model's answer (its ``tool/result`` is ``interrupted`` and no ``tool/call`` was written), a
call could not reserve its place in the budget chain (``budget``), or the run was interrupted
before the tools were dispatched. Both views say ``not run (OUTCOME: REASON)`` for those, from
the turn's recorded end, and show the arguments the model gave (from its
``assistant/message``) — distinct from a call that started and was interrupted.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import attrs

from dsh.core.messages import ToolCall
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import Event
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded

#: A text is cut only when at least this many lines, or this many characters, would be
#: hidden: a note in place of one more line would hide nothing worth hiding.
CUT_MIN_LINES = 4
CUT_MIN_CHARS = 200


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 tool call``, ``2 tool calls`` (``many``: an irregular plural)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def more_note(lines: int, chars: int) -> str:
    """``1 more line, 250 more characters`` (no line count when no whole line is hidden)."""
    parts = [plural(lines, "more line")] if lines else []
    return ", ".join([*parts, plural(chars, "more character")])


def cut(text: str, max_lines: int, max_chars: int) -> tuple[str, str]:
    """``text`` cut to ``max_lines`` lines and ``max_chars`` characters, and the note of what
    was hidden (:func:`more_note`; empty when nothing was cut). Nothing is cut when less than
    :data:`CUT_MIN_LINES` lines and :data:`CUT_MIN_CHARS` characters would be hidden."""
    pieces = text.splitlines(keepends=True)
    shown = "".join(pieces[:max_lines])[:max_chars]
    hidden = len(text) - len(shown)
    if not hidden:
        return text, ""
    shown_lines = len(shown.splitlines())
    hidden_lines = len(pieces) - shown_lines
    if hidden_lines < CUT_MIN_LINES and hidden < CUT_MIN_CHARS:
        return text, ""
    stripped = shown.rstrip("\r\n")
    return stripped, more_note(hidden_lines, len(text) - len(stripped))


# -- tool calls that never started ----------------------------------------------------------


@attrs.frozen
class NotRun:
    """A ``tool/result`` of a call that never started."""

    #: ``not run (budget: model requests limit reached (1/1))``.
    status: str
    #: The call as the model asked for it (its arguments), from its ``assistant/message``;
    #: None when no answer in the session asked for it.
    call: ToolCall | None
    #: The recorded output says no more than :attr:`status`.
    redundant: bool
    #: A ``tool/call`` shows the call (a ``budget`` refusal); else the views show it from
    #: :attr:`call`, where its result is.
    called: bool = False


#: The output dsh records for a call closed by the end of a run (dsh.ledger.writer).
_CLOSED = "interrupted: the run ended before this tool returned"


def not_run(events: Sequence[Event]) -> dict[int, NotRun]:
    """The ``tool/result`` events (by index in ``events``) of calls that never started."""
    asked: dict[str, ToolCall] = {}
    started: set[str] = set()
    waiting: list[int] = []  # never-started calls whose turn has not ended yet
    found: dict[int, NotRun] = {}
    for i, e in enumerate(events):
        if isinstance(e, AssistantMessage):
            for call in e.tool_calls:
                asked[call.id] = call
                started.discard(call.id)
        elif isinstance(e, ToolCalled):
            started.add(e.call_id)
        elif isinstance(e, ToolReturned):
            if e.status == "budget":  # refused before dispatch: output ``not run: LIMIT``
                why = e.output.removeprefix("not run: ").strip()
                found[i] = NotRun(f"not run (budget: {why})" if why else "not run (budget)",
                                  asked.get(e.call_id), e.output.startswith("not run: "),
                                  e.call_id in started)
            elif e.status == "interrupted" and e.call_id not in started:
                found[i] = NotRun("not run", asked.get(e.call_id), e.output == _CLOSED)
                waiting.append(i)
        elif isinstance(e, TurnEnded):
            why = f"{e.outcome}: {e.reason}" if e.reason else e.outcome
            for j in waiting:
                found[j] = attrs.evolve(found[j], status=f"not run ({why})")
            waiting = []
    return found


# -- plugin events dsh knows ------------------------------------------------------------------


def _approval(data: Mapping[str, Any]) -> str:
    """``approval: run_command `ls -la` (read) allowed by mode: mode ask allows it``."""
    subject = " ".join(str(data.get("subject") or "").split())
    if len(subject) > 120:
        subject = subject[:119] + "…"
    action = f" ({data['action']})" if data.get("action") else ""
    verdict = "allowed" if data.get("allowed") else "refused"
    by = f" by {data['by']}" if data.get("by") else ""
    why = f": {data['why']}" if data.get("why") else ""
    return f"approval: {data.get('tool')} `{subject}`{action} {verdict}{by}{why}"


def plugin_line(e: PluginEvent) -> str | None:
    """A readable one-line account of a plugin event whose data dsh knows — the sandbox
    that confined a call (``x/shell/sandbox``, ``x/mcp/sandbox``), an approval decision
    (``x/dsh.tools/approval``); None for any other (shown by its text ``summary``, else as
    compact JSON)."""
    data = e.data
    if e.name == "sandbox" and "policy" in data:
        from dsh.sandbox.policy import describe_record

        return describe_record(data)
    if e.plugin == "dsh.tools" and e.name == "approval" and "tool" in data:
        return _approval(data)
    return None
