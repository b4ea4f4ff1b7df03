"""Views of a session for the command line (docs/cli.md): the trajectory view (``dsh sessions
show``), the Markdown export (``dsh sessions export --format markdown``) and the sessions table
(``dsh sessions list``) — renderings of the session ledger only (MISSION C5).

What ``dsh run`` prints while it runs (status line, streamed text, ``--events``/``--json``,
closed pipes, Ctrl-C) is in :mod:`dsh.cli.terminal`; the inventories of ``dsh plugins``,
``tools``, ``models`` and ``agents`` are in :mod:`dsh.cli.inventories`.

Colour is used only when asked for (:func:`dsh.cli.escape.use_color`). Text from the ledger is
untrusted: on a terminal every piece of it goes through
:func:`dsh.cli.escape.escape_controls` (:class:`_Styler`); to a pipe or a file it is passed on
byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

import click

from dsh.cli.escape import escape_controls as escape_controls  # re-exported
from dsh.cli.escape import escape_json_controls as escape_json_controls  # re-exported
from dsh.cli.escape import one_line as one_line  # re-exported
from dsh.cli.escape import use_color as use_color  # re-exported
from dsh.cli.event_lines import cut
from dsh.cli.event_lines import not_run
from dsh.cli.event_lines import plugin_line
from dsh.cli.inventories import agent_rows as agent_rows  # re-exported
from dsh.cli.inventories import agents_text as agents_text  # re-exported
from dsh.cli.inventories import models_report as models_report  # re-exported
from dsh.cli.inventories import models_text as models_text  # re-exported
from dsh.cli.inventories import plugin_rows as plugin_rows  # re-exported
from dsh.cli.inventories import plugins_text as plugins_text  # re-exported
from dsh.cli.inventories import tool_rows as tool_rows  # re-exported
from dsh.cli.inventories import tools_text as tools_text  # re-exported
from dsh.cli.timefmt import local_time as local_time  # re-exported
from dsh.core.messages import Attachment
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextCompacted
from dsh.ledger.events import ContextInjected
from dsh.ledger.events import Event
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepRejected
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UnknownEvent
from dsh.ledger.events import UserMessage

#: Lines of a tool's output shown by ``dsh sessions show`` (``--full`` shows everything).
TOOL_OUTPUT_LINES = 12
TOOL_OUTPUT_CHARS = 2000


def _args(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=False)


def _truncate(text: str, full: bool) -> str:
    """The first :data:`TOOL_OUTPUT_LINES` lines (at most :data:`TOOL_OUTPUT_CHARS`) and a
    note of what is hidden — nothing cut when that would hide less than
    :data:`dsh.cli.event_lines.CUT_MIN_LINES` lines and ``CUT_MIN_CHARS`` characters."""
    if full:
        return text
    shown, note = cut(text, TOOL_OUTPUT_LINES, TOOL_OUTPUT_CHARS)
    return f"{shown}\n… ({note}; --full)" if note else text


def _indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())


class _Styler:
    """Styles a fragment of a view; on a terminal (``safe``) escapes its controls first, so
    only dsh's own styling reaches the terminal as escape sequences."""

    def __init__(self, color: bool, safe: bool = False) -> None:
        self.color = color
        self.safe = safe

    def text(self, text: str) -> str:
        return escape_controls(text) if self.safe else text

    def __call__(self, text: str, **style: Any) -> str:
        text = self.text(text)
        return click.style(text, **style) if self.color else text


#: How deep ``dsh sessions show`` follows sub-agent sessions (the runtime's own bound is 8).
MAX_NESTING = 8


def trajectory(events: Iterable[Event], *, color: bool = False, full: bool = False,
               children: Callable[[str], Iterable[Event]] | None = None,
               depth: int = 0, terminal: bool = False,
               installed: Callable[[str], bool] | None = None,
               attachment_problem: Callable[[Attachment], str | None] | None = None,
               price: Callable[[str], Any] | None = None) -> str:
    """The USER / ASSISTANT / TOOL timeline of a session, rendered from its ledger events.

    :param children: reads a child session's events: a sub-agent's session is then shown
        under the tool call that started it, indented with ``│``.
    :param terminal: the view goes to a terminal: every text from the ledger has its
        control characters made visible (:func:`escape_controls`).
    :param attachment_problem: why an attachment's bytes cannot be sent (missing, altered),
        or None: such an attachment is marked (issue 17).
    :param installed: tells whether a plugin is installed: a plugin event of one that is not
        is marked ``(plugin NAME not installed)``.
    :param price: a price lookup (:func:`dsh.run.costs.app_prices`): each turn's line then
        says its cost, and each sub-agent's session its tokens and cost under its call.
    """
    s = _Styler(color, terminal)
    out: list[str] = []
    usage = [0, 0]
    cached = [0, 0]  # prompt-cache reads, writes (parts of the input tokens)
    steps = 0
    model = ""  # the turn's model
    cost: Any = None  # with ``price``: the tally of the turn's responses (dsh.run.costs)

    def block(label: str, text: str, style: dict[str, Any], note: str = "") -> None:
        head = s(label, bold=True, **style) + (s(" " + note, dim=True) if note else "")
        out.append(head)
        if text.strip():
            out.append(_indent(s.text(text.rstrip("\n"))))

    def call_line(name: str, arguments: dict[str, Any], child: str = "") -> None:
        out.append(s("  → ", fg="yellow") + s(name, bold=True)
                   + " " + s.text(_args(arguments)) + s(child, dim=True))

    events = list(events)
    never_started = not_run(events)  # calls closed before they ran (budget, interrupt)
    for i, e in enumerate(events):
        if isinstance(e, TurnStarted):
            usage, cached, steps = [0, 0], [0, 0], 0
            model = e.model or model
            if price is not None:
                from dsh.run.costs import Tally

                cost = Tally()
            bits = [f"agent {e.agent}"] + ([f"model {e.model}"] if e.model else [])
            if e.tools is not None:
                bits.append(f"tools: {', '.join(t.name for t in e.tools) or 'none'}")
            if e.mode:
                bits.append(f"mode {e.mode}")
            for t in e.trust or ():
                bits.append(f"{t.get('decision')} {t.get('kind')} {t.get('path')}")
            if e.parent:
                bits.append(f"sub-agent of session {e.parent}")
            out.append(s(f"━━ turn {e.turn} ━━ ", fg="cyan", bold=True)
                       + s(" · ".join(bits), dim=True))
            if e.system:
                block("SYSTEM", e.system if full else _truncate(e.system, False),
                      {"fg": "white"})
        elif isinstance(e, StepStarted):
            steps += 1
            if e.step:
                out.append(s(f"· step {e.step + 1}", dim=True))
        elif isinstance(e, ContextInjected):
            block("CONTEXT", e.text, {"fg": "magenta"}, f"(injected by {e.source})")
        elif isinstance(e, UserMessage):
            note = f"({e.source})" if e.source != "user" else ""
            for f in e.fragments:  # before the text, as the model reads them; never whole
                out.append(s("  ◇ fragment ", fg="green") + s(fragment_label(f)))
            block("USER", e.text, {"fg": "green"}, note)
            for a in e.attachments:
                out.append(_attachment_line(a, s, attachment_problem))
        elif isinstance(e, AssistantMessage):
            usage[0] += e.usage.input_tokens
            usage[1] += e.usage.output_tokens
            cached[0] += e.usage.cache_read_tokens
            cached[1] += e.usage.cache_write_tokens
            if cost is not None and price is not None:
                from dsh.run.costs import price_of

                cost.add_usage(e.usage, price_of(price, model, e.model))
            for part in e.reasoning:
                out.append(reasoning_line(part, s, full))
            notes = []
            if e.tool_call_source and e.tool_call_source != "native":
                notes.append(f"tool calls rescued from text ({e.tool_call_source})")
            if e.stop_reason and e.stop_reason not in ("end_turn", "tool_use", "stop"):
                notes.append(f"stop: {e.stop_reason}")
            block("ASSISTANT", e.text, {"fg": "blue"}, " · ".join(notes))
        elif isinstance(e, ToolCalled):
            call_line(e.name, e.arguments,
                      f" (session {e.child_session})" if e.child_session else "")
            if e.child_session and children is not None and depth < MAX_NESTING:
                out.append(_nested(e.child_session, children, s, color, full, depth,
                                   installed, price))
        elif isinstance(e, ToolReturned) and i in never_started:
            nr = never_started[i]
            if not nr.called:  # no tool/call was written: the call as the model asked
                call_line(e.name, dict(nr.call.arguments) if nr.call else {},
                          "" if nr.call else " (arguments not recorded)")
            block(f"TOOL {e.name}", "" if nr.redundant else _truncate(e.output, full),
                  {"fg": "red"}, nr.status)
        elif isinstance(e, ToolReturned):
            ok = e.status == "ok"
            took = f" · {e.duration_ms:.0f} ms" if e.duration_ms is not None else ""
            block(f"TOOL {e.name}", _truncate(e.output, full),
                  {"fg": "yellow" if ok else "red"}, f"{e.status}{took}")
            if e.changes:  # the recorded diffs, coloured (never a re-read of the disk)
                from dsh.cli.diffs import diff_lines

                out.extend(diff_lines(e.changes, s, full=full))
        elif isinstance(e, StepRejected):
            by = f" by {e.plugin}" if e.plugin else ""
            block("REJECTED", e.text, {"fg": "red"}, f"step {e.step + 1}{by}: {e.reason}")
        elif isinstance(e, TurnEnded):
            style = {"fg": "cyan"} if e.outcome == "completed" else {"fg": "red"}
            reason = f" ({e.reason})" if e.reason else ""
            tail = f"{steps} step{'s' if steps != 1 else ''}"
            if usage != [0, 0]:
                tail += f" · {usage[0]} in{cache_note(*cached)} / {usage[1]} out tokens"
                if cost is not None:
                    from dsh.run.costs import format_cost

                    tail += f" · {format_cost(cost.cost)}"
            out.append(s(f"━━ turn {e.turn} {e.outcome}{reason} ━━ ", bold=True, **style)
                       + s(tail, dim=True))
            out.append("")
        elif isinstance(e, ContextCompacted):
            text = "\n".join(f"[{m.role}] {m.content}" for m in e.messages
                             if e.strategy != "mask" or m.role != "tool")
            block("CONTEXT COMPACTED", _truncate(text, full) if e.strategy != "mask" else "",
                  {"fg": "magenta"}, compaction_note(e))
        elif isinstance(e, PluginEvent) and (known := plugin_line(e)):
            # a record dsh knows (the sandbox that confined a call…): one readable line
            mark = "  ⛨ " if e.name == "sandbox" else "  ◆ "
            out.append(s(mark, fg="cyan") + s(known, dim=True))
        elif isinstance(e, PluginEvent):
            out.append(plugin_event_line(e, s, full, installed))
        elif isinstance(e, UnknownEvent):
            out.append(s(f"? {e.tag} (event type unknown to this dsh)", dim=True))
    return "\n".join(out).rstrip("\n") + "\n" if out else ""


#: Characters of a plugin event's data shown by ``dsh sessions show`` (``--full``: all).
PLUGIN_DATA_CHARS = 300
#: Characters of a plugin event's ``summary`` (a string in its data) shown instead of its data.
PLUGIN_SUMMARY_CHARS = 2000


def plugin_event_line(e: PluginEvent, s: _Styler, full: bool,
                      installed: Callable[[str], bool] | None) -> str:
    """``◆ x/PLUGIN/NAME v2 {data}``: a plugin's own event, never seen by the model. When
    ``data`` has a text ``summary``, that is shown instead (``--full``: the data)."""
    note = f" v{e.version}" if e.version != 1 else ""
    if installed is not None and not installed(e.plugin):
        note += f" (plugin {e.plugin} not installed)"
    summary = e.data.get("summary")
    if not full and isinstance(summary, str) and summary:
        # The plugin's own one-line account of the event (dsh-claude: which files shaped the
        # turn, with their digests), instead of its data cut at PLUGIN_DATA_CHARS.
        return (s("  ◆ ", fg="magenta") + s(e.tag, bold=True) + s(note, dim=True) + " "
                + s(" ".join(summary[:PLUGIN_SUMMARY_CHARS].split()), dim=True))
    data = json.dumps(e.data, ensure_ascii=False, separators=(",", ":"))
    if not full and len(data) > PLUGIN_DATA_CHARS:
        data = data[:PLUGIN_DATA_CHARS] + f"… ({len(data) - PLUGIN_DATA_CHARS} more; --full)"
    return (s("  ◆ ", fg="magenta") + s(e.tag, bold=True) + s(note, dim=True) + " "
            + s(data, dim=True))


def fragment_label(f: Any) -> str:
    """``a.py (1.2 KiB)``: a fragment by its name and size (its text is in the blob store)."""
    from dsh.llm.attachments import human_size

    return f"{f.name} ({human_size(f.size)})"


def _attachment_line(a: Attachment, s: _Styler,
                     problem: Callable[[Attachment], str | None] | None) -> str:
    """``  + name (image/png, 12.3 KiB, sha256 1a2b3c4d5e6f)``, marked when its bytes are
    missing or altered."""
    from dsh.llm.attachments import describe

    line = s("  + ", fg="green") + s(describe(a))
    why = problem(a) if problem is not None else None
    if why:
        line += " " + s("[cannot be sent: " + why + "]", fg="red", bold=True)
    return line


#: Characters of a reasoning part's text shown by ``dsh sessions show`` (``--full``: all).
REASONING_CHARS = 160


def cache_note(read: int, written: int) -> str:
    """`` (R cache read, W cache write)`` after an input token count; empty without any."""
    if not (read or written):
        return ""
    return f" ({read} cache read, {written} cache write)"


def usage_totals(events: Iterable[Event], price: Callable[[str], Any] | None = None,
                 children: Callable[[str], Iterable[Event]] | None = None) -> str | None:
    """``usage: N in (R cache read, W cache write) / M out tokens, K responses`` over a
    session's ``assistant/message`` events (``dsh sessions show``); None when none counted.
    With ``price`` (and ``children``), the cost too, sub-agents' sessions included."""
    if price is not None:
        from dsh.run.costs import session_cost
        from dsh.run.costs import tally_text

        found = session_cost(events, price, children)
        t = found.total
        if not t.counted:
            return None
        n, k = t.responses, len(found.children)
        subs = f" (with {k} sub-agent session{'s' if k != 1 else ''})" if k else ""
        return f"usage: {tally_text(t)}, {n} response{'s' if n != 1 else ''}{subs}"
    total = [0, 0, 0, 0, 0]
    for e in events:
        if isinstance(e, AssistantMessage):
            u = e.usage
            total[0] += u.input_tokens
            total[1] += u.output_tokens
            total[2] += u.cache_read_tokens
            total[3] += u.cache_write_tokens
            total[4] += 1
    if not (total[0] or total[1]):
        return None
    n = total[4]
    return (f"usage: {total[0]} in{cache_note(total[2], total[3])} / {total[1]} out tokens, "
            f"{n} response{'s' if n != 1 else ''}")


def _size(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{n / 1024:.1f} KB"


def reasoning_line(part: Any, s: _Styler, full: bool) -> str:
    """One reasoning part, dimmed (issue 17): ``  ∴ thinking: …`` — its text shortened to
    :data:`REASONING_CHARS` unless ``full``, secrets redacted (:func:`dsh.core.redact.redact`);
    an opaque part (redacted thinking, encrypted reasoning) as a marker with its size.
    Signatures and opaque data are never shown (they are replayed to the provider as
    recorded, not read)."""
    from dsh.core.redact import redact

    label = f"{part.kind} ({part.provider})"
    opaque = part.data or ""
    if not part.text and not opaque:
        return s(f"  ∴ [{label}, empty]", dim=True)
    if not part.text:
        what = "" if "redacted" in part.kind else "encrypted, "
        return s(f"  ∴ [{label}, {what}{_size(len(opaque.encode()))}]", dim=True)
    text = redact(part.text)
    if not full:
        flat = " ".join(text.split())
        if len(flat) > REASONING_CHARS:
            text = flat[:REASONING_CHARS] + f"… ({len(flat) - REASONING_CHARS} more; --full)"
        else:
            text = flat
    extra = f" [+ encrypted, {_size(len(opaque.encode()))}]" if opaque else ""
    head = s(f"  ∴ {label}{extra}:", dim=True)
    body = s(_indent(text.rstrip("\n"), "    "), dim=True) if full else s(" " + text, dim=True)
    return head + ("\n" + body if full else body)


def compaction_note(e: ContextCompacted) -> str:
    """One line about a compaction: what replaced what, by whom, why, and the sizes."""
    by = f" by {e.plugin}" if e.plugin else ""
    note = (f"({e.strategy}{by}, {e.reason}): messages {e.start + 1}-{e.end} replaced by "
            f"{len(e.messages)} · ~{e.tokens_before} → ~{e.tokens_after} tokens")
    if e.summary_session:
        note += f" · summary written in session {e.summary_session}"
    return note + " · the originals are above, still in the ledger"


def _nested(session: str, children: Callable[[str], Iterable[Event]], s: _Styler,
            color: bool, full: bool, depth: int,
            installed: Callable[[str], bool] | None = None,
            price: Callable[[str], Any] | None = None) -> str:
    """A sub-agent's session under the call that started it; with ``price``, its tokens and
    cost (its own sub-agents' included) on a last line."""
    from dsh.core.errors import DshError

    tally = None
    try:
        events = list(children(session))
        text = trajectory(events, color=color, full=full, children=children,
                          depth=depth + 1, terminal=s.safe, installed=installed, price=price)
        if price is not None:
            from dsh.run.costs import session_cost

            tally = session_cost(events, price, children, depth + 1).total
    except DshError as exc:
        text = s.text(f"(session {session} cannot be read: {exc})") + "\n"
    bar = s("    │ ", dim=True)
    lines = [bar + line for line in text.rstrip("\n").splitlines()]
    if tally is not None:
        from dsh.run.costs import tally_text

        lines.append(s(f"    └ sub-agent {session}: {tally_text(tally)}", dim=True))
    return "\n".join(lines)


def _fence(text: str, lang: str = "") -> str:
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text.rstrip(chr(10))}\n{fence}"


def markdown(session_id: str, events: Iterable[Event]) -> str:
    """The session as a Markdown document (``dsh sessions export --format markdown``)."""
    parts: list[str] = [f"# Session {session_id}"]
    events = list(events)
    never_started = not_run(events)
    for i, e in enumerate(events):
        if isinstance(e, ToolReturned) and i in never_started:
            nr = never_started[i]
            if nr.call is not None and not nr.called:
                parts.append(f"**Tool call** `{nr.call.name}`\n\n" + _fence(json.dumps(
                    dict(nr.call.arguments), ensure_ascii=False, indent=2), "json"))
            parts.append(f"**Tool result** `{e.name}` ({nr.status})"
                         + ("" if nr.redundant else "\n\n" + _fence(e.output)))
        elif isinstance(e, TurnStarted):
            meta = [f"agent `{e.agent}`"] + ([f"model `{e.model}`"] if e.model else [])
            parts.append(f"## Turn {e.turn}\n\n_{', '.join(meta)} · {e.ts}_")
            if e.system:
                parts.append("**System**\n\n" + _fence(e.system))
        elif isinstance(e, ContextInjected):
            parts.append(f"**Context** (injected by `{e.source}`)\n\n" + _fence(e.text))
        elif isinstance(e, UserMessage):
            src = f" (`{e.source}`)" if e.source != "user" else ""
            head = f"**User**{src}\n\n"
            if e.fragments:  # before the text, as the model reads them; never whole
                head += "".join(f"- fragment: {fragment_label(f)}\n" for f in e.fragments) + "\n"
            parts.append(head + e.text.strip())
            if e.attachments:
                from dsh.llm.attachments import describe

                parts.append("\n".join(f"- attachment: {describe(a)}" for a in e.attachments))
        elif isinstance(e, AssistantMessage):
            if e.text.strip():
                parts.append(f"**Assistant**\n\n{e.text.strip()}")
        elif isinstance(e, ToolCalled):
            parts.append(f"**Tool call** `{e.name}`\n\n"
                         + _fence(json.dumps(e.arguments, ensure_ascii=False, indent=2), "json"))
        elif isinstance(e, ToolReturned):
            parts.append(f"**Tool result** `{e.name}` ({e.status})\n\n" + _fence(e.output))
            if e.changes:
                from dsh.cli import diffs

                parts.append(diffs.markdown(e.changes))
        elif isinstance(e, StepRejected):
            by = f" by `{e.plugin}`" if e.plugin else ""
            parts.append(f"**Step rejected**{by}: {e.reason}")
        elif isinstance(e, ContextCompacted):
            parts.append(f"**Context compacted** {compaction_note(e)}")
        elif isinstance(e, PluginEvent):
            parts.append(f"**Plugin event** `{e.tag}` (version {e.version})\n\n"
                         + _fence(json.dumps(e.data, ensure_ascii=False, indent=2), "json"))
        elif isinstance(e, TurnEnded):
            reason = f": {e.reason}" if e.reason else ""
            parts.append(f"_Turn {e.turn} {e.outcome}{reason}_")
    return "\n\n".join(parts) + "\n"
