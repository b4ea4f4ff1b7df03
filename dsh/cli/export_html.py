"""``dsh sessions export --html``: one self-contained HTML page of a session (issue 28, C5).

The page is only a rendering of the ledger: turns and steps, user and assistant messages, tool
calls with their arguments and results (long ones folded, huge ones cut), reasoning (folded;
never signatures or encrypted data), compactions, sub-agent runs nested where their tool call
is, attachments (images inline from the blob store, size-capped), plugin events, and an SVG
chart of tokens and cost per model response.

Every piece of text from the ledger is hostile (a model wrote it): it passes through
:func:`html.escape` (and :func:`dsh.core.redact.redact`, which hides credential shapes) and
lands only in text nodes or quoted attributes. Nothing from the ledger becomes a URL, a style
or a script; images are ``data:`` URLs made here from verified blob bytes of a fixed list of
raster types. As a second wall, the page's Content-Security-Policy allows no network fetch, no
script but the page's own (by hash) and no image but ``data:``.

The CSS and script are in :mod:`dsh.cli.html_assets`. Cost is linear in the session's size.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable
from collections.abc import Iterable
from html import escape
from typing import Any

from dsh.cli.event_lines import NotRun
from dsh.cli.render import fragment_label
from dsh.cli.event_lines import not_run
from dsh.cli.event_lines import plugin_line
from dsh.cli.event_lines import plural
from dsh.cli.html_chart import CHART_BARS as _CHART_BARS
from dsh.core.redact import redact
from dsh.ledger.events import AssistantMessage
from dsh.ledger.events import ContextCompacted
from dsh.ledger.events import ContextInjected
from dsh.ledger.events import Event
from dsh.ledger.events import PluginEvent
from dsh.ledger.events import StepEnded
from dsh.ledger.events import StepRejected
from dsh.ledger.events import StepStarted
from dsh.ledger.events import ToolCalled
from dsh.ledger.events import ToolReturned
from dsh.ledger.events import TurnEnded
from dsh.ledger.events import TurnStarted
from dsh.ledger.events import UnknownEvent
from dsh.ledger.events import UserMessage

#: Characters of one text block shown unfolded; longer ones are folded in a ``<details>``.
FOLD_CHARS = 600
#: Characters of one text block put in the page at all; the rest is cut with a note (a 10 MB
#: tool output must not make a 10 MB page that a browser lays out).
SHOW_CHARS = 64 * 1024
#: Bytes of one image shown inline, and of all of a page's images together.
IMAGE_BYTES = 2 * 1024 * 1024
IMAGES_TOTAL = 16 * 1024 * 1024
#: Raster types shown inline (never SVG: it is a document of its own).
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: Bars of the chart at most (:mod:`dsh.cli.html_chart`): a longer session is bucketed.
CHART_BARS = _CHART_BARS
#: Sub-agent sessions nested inside one another at most.
MAX_NESTING = 8

_ID = re.compile(r"[^A-Za-z0-9_-]")

Price = Callable[[str], "tuple[float | None, ...] | None"]


def _anchor(session: str) -> str:
    """An ``id`` attribute for a session: only ``[A-Za-z0-9_-]`` survive."""
    return "s-" + _ID.sub("_", session)[:80]


_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _t(text: Any) -> str:
    """Text for a text node or a quoted attribute: redacted, control characters (invalid in
    HTML, and live on a terminal) as U+FFFD, escaped."""
    return escape(_CONTROLS.sub("\ufffd", redact(str(text))), quote=True)


def _changes(changes: Any) -> str:
    """The recorded diffs of a tool result, one ``<details>`` each, coloured per line (the
    ledger's diff, never the disk; cut at :data:`SHOW_CHARS` like every block)."""
    from dsh.cli.diffs import headline

    parts = []
    for c in changes:
        text = c.diff[:SHOW_CHARS]
        rows = []
        for line in text.splitlines():
            kind = ("meta" if line.startswith(("+++ ", "--- ")) else "add" if line[:1] == "+"
                    else "del" if line[:1] == "-" else "hunk" if line[:2] == "@@" else "ctx")
            rows.append(f'<span class="{kind}">{_t(line)}</span>')
        cut = (f'<p class="cut">{len(c.diff) - SHOW_CHARS} more characters of diff not shown '
               "(the full diff is in the session's ledger)</p>" if len(c.diff) > SHOW_CHARS
               else "")
        parts.append(f'<details class="change" open><summary>{_t(headline(c))}</summary>'
                     f'<pre class="diff">{chr(10).join(rows)}</pre>{cut}</details>')
    return "".join(parts)


def _block(text: str, cls: str, label: str = "") -> str:
    """A ``<pre>`` of ``text``: cut at :data:`SHOW_CHARS`, folded past :data:`FOLD_CHARS`."""
    n = len(text)
    cut = ""
    if n > SHOW_CHARS:
        cut = (f'<p class="cut">{n - SHOW_CHARS} more characters not shown '
               "(the full text is in the session's ledger)</p>")
        text = text[:SHOW_CHARS]
    body = f'<pre class="{cls}">{_t(text)}</pre>{cut}'
    if n <= FOLD_CHARS and text.count("\n") < 12:
        return body
    summary = _t(label or text[:80].replace("\n", " "))
    return (f'<details class="fold"><summary>{summary} <span class="size">'
            f"({n} chars)</span></summary>{body}</details>")


_SCALARS = (str, int, float, bool, type(None))


def _json(value: Any) -> str:
    """``value`` as indented JSON (sorted keys). A flat object of scalars, the common shape of
    tool arguments, is joined from the C encoder's pieces: ``indent`` would take the pure
    Python encoder, most of the export's time on a long session; the text is the same."""
    if type(value) is dict and value and all(
            type(k) is str and type(v) in _SCALARS for k, v in value.items()):
        dumps = json.dumps
        return "{\n" + ",\n".join(
            f" {dumps(k, ensure_ascii=False)}: {dumps(value[k], ensure_ascii=False)}"
            for k in sorted(value)) + "\n}"
    try:
        return json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


class Page:
    """Builds the page: :meth:`session` for each session (recursively for sub-agents)."""

    def __init__(self, children: Callable[[str], list[Event]] | None = None,
                 blobs: Any = None, price: Price | None = None) -> None:
        self.children = children
        self.blobs = blobs
        self.price = price
        self.out: list[str] = []
        self.counts = {"turns": 0, "steps": 0, "tool_calls": 0, "responses": 0,
                       "compactions": 0, "subagents": 0, "input": 0, "output": 0}
        self.cost = 0.0
        self.priced = False
        self.points: list[tuple[int, int, float]] = []  # per response: in, out, cost
        self.image_bytes = 0
        self.seen: set[str] = set()
        self.prices: dict[str, tuple[float | None, ...] | None] = {}
        self.notes: dict[str, NotRun] = {}  # the current session's calls that never ran

    # -- sessions ---------------------------------------------------------------------------

    def session(self, sid: str, events: Iterable[Event], depth: int = 0) -> None:
        self.seen.add(sid)
        w = self.out.append
        w(f'<section class="session" id="{_anchor(sid)}" data-session="{_t(sid)}">')
        model = ""
        results: dict[str, ToolReturned] = {}
        events = list(events)
        never = not_run(events)  # calls closed before they ran (budget, interrupt)
        notes: dict[str, NotRun] = {}
        for i, e in enumerate(events):
            if isinstance(e, ToolReturned):
                results.setdefault(e.call_id, e)
                if i in never:
                    notes.setdefault(e.call_id, never[i])
        outer, self.notes = self.notes, notes
        in_step = False
        for i, e in enumerate(events):
            if isinstance(e, TurnStarted):
                self.counts["turns"] += 1
                model = e.model or model
                parent = (f' · sub-agent of <a href="#{_anchor(e.parent)}">{_t(e.parent)}</a>'
                          if e.parent else "")
                w(f'<h2 class="turn" data-seq="{e.seq}">Turn {e.turn} · agent {_t(e.agent)}'
                  f'{" · model " + _t(model) if model else ""}{parent}</h2>')
                if e.system:
                    w('<div class="ev system"><b>system</b>'
                      f'{_block(e.system, "text", "system prompt")}</div>')
            elif isinstance(e, StepStarted):
                if in_step:
                    w("</div>")
                self.counts["steps"] += 1
                in_step = True
                # numbered from 1, as ``dsh sessions show`` numbers them
                w(f'<div class="step" data-seq="{e.seq}"><div class="step-h">'
                  f"step {e.step + 1}</div>")
            elif isinstance(e, StepEnded):
                if in_step:
                    w("</div>")
                in_step = False
            elif isinstance(e, ToolReturned) and i in never and not never[i].called:
                self.never_called(e, never[i])  # no tool/call: shown here, as asked
            else:
                self.event(e, results, model, depth)
        if in_step:
            w("</div>")
        w("</section>")
        self.notes = outer

    def event(self, e: Event, results: dict[str, ToolReturned], model: str, depth: int) -> None:
        w = self.out.append
        if isinstance(e, UserMessage):
            src = "" if e.source == "user" else f" ({_t(e.source)})"
            w(f'<div class="ev user" data-seq="{e.seq}"><b>user{src}</b>')
            for f in e.fragments:  # before the text, as the model reads them; never whole
                w(f'<div class="attachment">fragment {_t(fragment_label(f))}</div>')
            w(_block(e.text, "text"))
            for a in e.attachments:
                w(self.attachment(a))
            w("</div>")
        elif isinstance(e, ContextInjected):
            w(f'<div class="ev context" data-seq="{e.seq}"><b>context ({_t(e.source)})</b>'
              f'{_block(e.text, "text")}</div>')
        elif isinstance(e, AssistantMessage):
            self.assistant(e, model)
        elif isinstance(e, ToolCalled):
            self.tool(e, results.get(e.call_id), depth)
        elif isinstance(e, ToolReturned):
            pass  # shown with its call
        elif isinstance(e, StepRejected):
            who = f" by {_t(e.plugin)}" if e.plugin else ""
            w(f'<div class="ev rejected" data-seq="{e.seq}"><b>step rejected{who}</b>'
              f'{_block(e.reason or e.text, "text")}</div>')
        elif isinstance(e, TurnEnded):
            w(f'<div class="ev end {_ID.sub("", e.outcome)[:20]}" data-seq="{e.seq}">'
              f"<b>turn {e.turn} {_t(e.outcome)}</b> {_t(e.reason)}</div>")
        elif isinstance(e, ContextCompacted):
            self.compaction(e)
        elif isinstance(e, PluginEvent):
            self.plugin(e)
        elif isinstance(e, UnknownEvent):
            w(f'<div class="ev unknown" data-seq="{e.seq}"><b>{_t(e.tag)}</b> (unknown)'
              f'{_block(_json(e.extra), "json", "data")}</div>')

    def assistant(self, e: AssistantMessage, model: str) -> None:
        w = self.out.append
        u = e.usage
        self.counts["responses"] += 1
        self.counts["input"] += u.input_tokens
        self.counts["output"] += u.output_tokens
        cost = 0.0
        price = self._price(model, e.model)
        if price is not None:
            from dsh.run.budget import request_cost

            cost = request_cost(u, price)
            self.cost += cost
            self.priced = True
        self.points.append((u.input_tokens, u.output_tokens, cost))
        usage = (f'<span class="usage">{u.input_tokens} in / {u.output_tokens} out'
                 f'{f" · ${cost:.6f}" if price is not None else ""}</span>')
        w(f'<div class="ev assistant" data-seq="{e.seq}"><b>assistant</b> {usage}')
        for part in e.reasoning:
            if part.text:
                w(f'<details class="reasoning"><summary>reasoning ({_t(part.kind)}, '
                  f'{len(part.text)} chars)</summary><pre class="text">'
                  f"{_t(part.text[:SHOW_CHARS])}</pre></details>")
            else:  # opaque (redacted or encrypted): a marker, never the data
                w(f'<div class="reasoning opaque">reasoning ({_t(part.kind)}, '
                  f"{len(part.data or '')} bytes, not readable)</div>")
        if e.text:
            w(_block(e.text, "text"))
        w("</div>")

    def plugin(self, e: PluginEvent) -> None:
        """One line: what dsh knows the event says (the sandbox of a call…), else the
        plugin's own ``summary``, else its data as compact JSON (folded when long)."""
        w = self.out.append
        head = (f'<div class="ev plugin" data-seq="{e.seq}" title="{_t(e.tag)} v{e.version}">'
                f"<b>{_t(e.tag)}</b>")
        line = plugin_line(e)
        summary = e.data.get("summary")
        if line is None and isinstance(summary, str) and summary:
            line = " ".join(summary.split())
        if line is not None:
            w(f'{head} <span class="line">{_t(line[:SHOW_CHARS])}</span></div>')
            return
        data = json.dumps(e.data, ensure_ascii=False, separators=(",", ":"), default=str)
        version = f" v{e.version}" if e.version != 1 else ""
        if len(data) <= 200:
            w(f'{head}{version} <code class="data">{_t(data)}</code></div>')
        else:
            w(f'{head}{version}{_block(data, "json", "data")}</div>')

    def never_called(self, e: ToolReturned, note: NotRun) -> None:
        """A call the model asked for that was closed before any ``tool/call``: its
        arguments as asked, ``not run (…)``."""
        w = self.out.append
        self.counts["tool_calls"] += 1
        args = (_block(_json(dict(note.call.arguments)), "json args", "arguments")
                if note.call is not None else '<p class="cut">arguments not recorded</p>')
        body = "" if note.redundant else (
            f'<div class="result">{_block(e.output, "text out", "result")}</div>')
        w(f'<div class="ev tool-call not-run" data-seq="{e.seq}" data-call="{_t(e.call_id)}">'
          f'<b>tool {_t(e.name)}</b> <span class="status">{_t(note.status)}</span>'
          f"{args}{body}</div>")

    def tool(self, e: ToolCalled, result: ToolReturned | None, depth: int) -> None:
        w = self.out.append
        self.counts["tool_calls"] += 1
        status = result.status if result is not None else "no result"
        note = self.notes.get(e.call_id) if result is not None else None
        took = (f" · {result.duration_ms:.0f} ms"
                if result is not None and result.duration_ms is not None else "")
        w(f'<div class="ev tool-call {"not-run" if note else _ID.sub("", status)[:20]}" '
          f'data-seq="{e.seq}" data-call="{_t(e.call_id)}"><b>tool {_t(e.name)}</b> '
          f'<span class="status">{_t(note.status if note else status)}{took}</span>'
          f'{_block(_json(dict(e.arguments)), "json args", "arguments")}')
        if result is not None and not (note is not None and note.redundant):
            w(f'<div class="result">{_block(result.output, "text out", "result")}</div>')
            if result.changes:
                w(_changes(result.changes))
        child = e.child_session
        if child:
            self.counts["subagents"] += 1
            w(f'<details class="subagent" open><summary>sub-agent session '
              f'<a href="#{_anchor(child)}">{_t(child)}</a></summary>')
            if child in self.seen or depth >= MAX_NESTING or self.children is None:
                w('<p class="cut">not nested here (already shown, or too deep)</p>')
            else:
                try:
                    events = self.children(child)
                except Exception as exc:  # noqa: BLE001 - a missing child: say so, go on
                    w(f'<p class="cut">cannot read it: {_t(exc)}</p>')
                else:
                    self.session(child, events, depth + 1)
            w("</details>")
        w("</div>")

    def compaction(self, e: ContextCompacted) -> None:
        self.counts["compactions"] += 1
        by = f" by {_t(e.plugin)}" if e.plugin else ""
        w = self.out.append
        w(f'<div class="ev compaction" data-seq="{e.seq}"><b>context compacted</b> '
          f"messages {e.start + 1}–{e.end} replaced by {len(e.messages)} "
          f"({_t(e.strategy)}{by}, {_t(e.reason)}): ~{e.tokens_before} → ~{e.tokens_after} "
          "tokens")
        if e.summary_session:
            w(f' · summary written in <a href="#{_anchor(e.summary_session)}">'
              f"{_t(e.summary_session)}</a>")
        if e.messages:
            w('<details class="fold"><summary>replacement messages</summary>')
            for m in e.messages:
                w(f'<div class="msg"><b>{_t(m.role)}</b>{_block(m.content, "text")}</div>')
            w("</details>")
        w("</div>")

    def attachment(self, a: Any) -> str:
        label = f"{_t(a.name or a.sha256[:12])} ({_t(a.media_type)}, {int(a.size)} bytes)"
        if a.media_type not in IMAGE_TYPES or self.blobs is None:
            return f'<div class="attachment">attachment {label}</div>'
        if a.size > IMAGE_BYTES or self.image_bytes + a.size > IMAGES_TOTAL:
            return f'<div class="attachment">attachment {label}: too large to show inline</div>'
        from dsh.ledger.blobs import AttachmentMissing
        from dsh.llm.attachments import verified

        try:
            data = verified(self.blobs, a)
        except AttachmentMissing as exc:
            return f'<div class="attachment missing">attachment {label}: {_t(exc)}</div>'
        self.image_bytes += len(data)
        b64 = base64.b64encode(data).decode("ascii")
        return (f'<div class="attachment">{label}<br><img alt="{_t(a.name or "")}" '
                f'src="data:{a.media_type};base64,{b64}"></div>')

    def _price(self, configured: str, reported: str | None) -> tuple[float | None, ...] | None:
        """The price of the turn's configured model id, else of the id the provider reported
        (once per id)."""
        if self.price is None:
            return None
        for model in (configured, reported):
            if model:
                if model not in self.prices:
                    self.prices[model] = self.price(model)
                if self.prices[model] is not None:
                    return self.prices[model]
        return None

    # -- the chart --------------------------------------------------------------------------

    def chart(self) -> str:
        """The SVG chart of tokens (and cost) per response (:mod:`dsh.cli.html_chart`)."""
        from dsh.cli.html_chart import chart

        return chart(self.points, self.priced)


def render(session_id: str, events: Iterable[Event], *,
           children: Callable[[str], list[Event]] | None = None, blobs: Any = None,
           price: Price | None = None) -> str:
    """The page of session ``session_id`` from its ``events``; ``children(sid)`` reads a
    sub-agent's session (None: not nested), ``blobs`` is the store attachments are read
    from, ``price(model)`` the model's price (:func:`dsh.run.budget.model_price`) or None."""
    from dsh.cli.html_assets import CSS
    from dsh.cli.html_assets import SCRIPT

    page = Page(children, blobs, price)
    page.session(session_id, events)
    c = page.counts
    cost = f" · cost ${page.cost:.6f}" if page.priced else ""
    script_hash = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    csp = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
           f"script-src 'sha256-{script_hash}'; form-action 'none'; base-uri 'none'")
    head = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="referrer" content="no-referrer">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>dsh session {_t(session_id)}</title><style>{CSS}</style></head><body>"
        f'<header><h1>dsh session <code>{_t(session_id)}</code></h1>'
        f'<p class="summary">{plural(c["turns"], "turn")} · {plural(c["steps"], "step")} · '
        f'{plural(c["tool_calls"], "tool call")} · '
        f'{plural(c["responses"], "model response")} · '
        f'{c["input"]} in / {c["output"]} out tokens{cost} · '
        f'{plural(c["compactions"], "compaction")} · '
        f'{plural(c["subagents"], "sub-agent run")}</p>'
        '<p class="controls"><button type="button" id="open-all">expand all</button> '
        '<button type="button" id="close-all">collapse all</button></p>'
        f'<figure>{page.chart()}</figure></header><main>'
    )
    return head + "".join(page.out) + f"</main><script>{SCRIPT}</script></body></html>\n"


def page_of(app: Any, session_id: str, events: list[Event]) -> str:
    """:func:`render` with ``app``'s store (sub-agent sessions, attachments) and prices."""
    from dsh.run.budget import model_price

    store = app.store
    models = app.config.models

    def price(model: str) -> tuple[float | None, ...] | None:
        return model_price(model, models.get(model)) if model else None

    return render(session_id, events, children=store.read, blobs=store, price=price)
